"""The type hints (issue 14): every public function and method of both packages is annotated. That
mypy, with the settings in pyproject.toml (the packages only; NumPyro and funsor ship no py.typed),
finds no error in them is ``make types``, a step of CI (``.ci/run``) beside the suite: it reads
torch's hints, 20-30 s of the suite's budget."""

import inspect

import pytest

from tests.test_mirror import PUBLIC_MODULES

PACKAGES = ["pyro_concrete", "numpyro_concrete"]
# modules whose __all__ is API beside the package's own: the public modules, and those a user reaches
# for by name (constraints and transforms registered with biject_to, the handlers' Messengers)
TYPED_MODULES = PUBLIC_MODULES + ["constraints", "transforms", "handlers", "reparam", "temperature"]


def _public_functions(package_name):
    """(qualified name, function) of every public function, and of every public method (and
    ``__init__``/``__call__``) of every public class, defined in the package (not inherited)."""
    package = pytest.importorskip(package_name)
    objects = [getattr(package, name) for name in package.__all__]
    for module_name in TYPED_MODULES:
        module = getattr(package, module_name, None) or __import__(f"{package_name}.{module_name}", fromlist=["_"])
        objects += [getattr(module, name) for name in getattr(module, "__all__", [])]
    found = {}
    for obj in objects:
        if inspect.isfunction(obj):
            found[obj.__qualname__] = obj
        elif inspect.isclass(obj):
            for klass in obj.__mro__:
                if not klass.__module__.startswith(package_name):
                    continue
                for attribute, value in vars(klass).items():
                    if attribute.startswith("_") and attribute not in ("__init__", "__call__"):
                        continue
                    function = value.fget if isinstance(value, property) else getattr(value, "__func__", value)
                    function = getattr(function, "__wrapped__", function) if not inspect.isfunction(function) else function
                    if inspect.isfunction(function):
                        found[f"{klass.__qualname__}.{attribute}"] = function
    return found


@pytest.mark.parametrize("package_name", PACKAGES)
def test_the_public_api_is_annotated(package_name):
    functions = _public_functions(package_name)
    assert len(functions) > 60  # the walk found the API
    missing = {}
    for name, function in functions.items():
        signature = inspect.signature(function)
        unannotated = [p.name for p in signature.parameters.values()
                       if p.name not in ("self", "cls") and p.annotation is inspect.Parameter.empty]
        if signature.return_annotation is inspect.Signature.empty:
            unannotated.append("return")
        if unannotated:
            missing[name] = unannotated
    assert not missing, missing
