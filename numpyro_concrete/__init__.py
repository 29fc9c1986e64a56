"""The Concrete distribution family for NumPyro (placeholder: the NumPyro backend is issue 3)."""
