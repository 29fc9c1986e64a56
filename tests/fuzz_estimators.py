"""Every loss and estimator of both packages on small random models: unbiased, or a ValueError,
never a third outcome (issue 29).

A case is a model and guide drawn from a seed (``tests/random_models.py``). Each loss runs on it
in both backends, on the relaxed graph (``model``, ``guide``) or on the discrete one
(``discrete(model)``, ``discrete(guide)``) as its users run it, for ``--seeds`` draws at the initial
parameters; its mean value and mean gradient in every parameter of the model and guide are
compared with what it estimates, computed in NumPy (``tests/exact_objectives.py``): the discrete
graph's ELBO (ScoreFunctionELBO, REBAR, RELAX, DisARM; Gumbel-Rao's value), its bound L_m (VIMCO),
the relaxed graph's bound L_m (ImportanceWeightedELBO), and the straight-through estimator's mean
(Gumbel-Rao's gradient, biased by design: its claim is the mean of straight-through).

Outcomes of one loss on one case:

- ``unbiased``: every z-score (estimate minus reference over their combined standard error) within
  the threshold; ``refused``: a ValueError naming the loss, where the loss documents a refusal
  (:func:`expected_refusals`);
- the third outcomes: ``biased`` (a z-score beyond the threshold at the first ``--seeds`` draws,
  again at four times as many fresh ones, and again at twenty times as many), ``crashed`` (another exception), ``non-finite``,
  ``refused-unexpectedly`` (a ValueError where the documented rules accept the model) and
  ``accepted-unexpectedly`` (no refusal where they refuse).

The threshold makes a correct loss fail a case with probability below 1e-4: Bonferroni over the
checks of the case (every parameter entry and the value, of every loss and backend), at each of
the two stages.

    python -m tests.fuzz_estimators --cases 2000 --jobs 2 --out sweep.jsonl --report report.txt
    python -m tests.fuzz_estimators --case 17 --verbose      # one case, every z-score
    python -m tests.fuzz_estimators --from-jsonl tests/fuzz_sweep/*.jsonl.gz   # the committed sweep's report

``tests/test_fuzz_estimators.py`` runs a fixed list of cases in the suite.
"""

import argparse
import functools
import gzip
import json
import os
import re
import sys
import time
import warnings
from dataclasses import dataclass, field

import numpy as np
from scipy import stats

from tests import exact_objectives, random_models
from tests.backends import BACKEND_NAMES, load_backend

# draws of each loss at the first stage (four times as many fresh ones at the second, twenty times at
# the third: heavy tails -- a gradient of 0 in most draws and large in a few -- can hide from the
# first draws' variance, as in case 808, Pyro's RELAX, whose 750 draws held none of its few
# |gradient| > 2 that 3000 more held, z 6.6 then 0.7): NumPyro runs
# them in one compiled vmap, where they cost little beside the compilation; Pyro one by one
SEEDS = {"pyro": 150, "numpyro": 1500}
FALSE_FAILURE = 1e-4  # per case
REFERENCE_DRAWS = 2000

# loss: (the graph it runs on, the graph whose objective it estimates, which objective)
LOSSES = {
    "ImportanceWeightedELBO": ("relaxed", "relaxed", "bound"),
    "VIMCO": ("discrete", "discrete", "bound"),
    "ScoreFunctionELBO": ("discrete", "discrete", "elbo"),
    "REBAR": ("relaxed", "discrete", "elbo"),
    "RELAX": ("relaxed", "discrete", "elbo"),
    "DisARM": ("relaxed", "discrete", "elbo"),
    "GumbelRao": ("relaxed", "discrete", "straight_through"),
    "JitImportanceWeightedELBO": ("relaxed", "relaxed", "bound"),  # Pyro only
    "JitVIMCO": ("discrete", "discrete", "bound"),  # Pyro only
}
ESTIMATORS = ("REBAR", "RELAX", "DisARM", "GumbelRao")


def losses_of(backend):
    return [name for name in LOSSES if hasattr(backend.lib, name)]


def make_loss(backend, name, spec):
    cls = getattr(backend.lib, name)
    jit = {"ignore_jit_warnings": True} if name.startswith("Jit") else {}
    if name.endswith("ImportanceWeightedELBO") or name.endswith("VIMCO"):
        return cls(spec.particles, plate=spec.plate, **jit)
    if name == "GumbelRao":
        return cls(plate=spec.plate, num_samples=spec.gumbel_rao_samples)
    if name == "RELAX":
        return cls(plate=spec.plate, control_variate=backend.control_variate(random_models.relax_features(spec), seed=spec.seed))
    return cls(plate=spec.plate)


# RELAX runs with its control variate's parameters away from their initial values (and a random
# network): unbiased whatever they are. REBAR at its initial values, without NumPyro's declaration
# of them in the guide: its guide's gradient is the same, and the variance's gradient that trains
# them (a second derivative, half of NumPyro's compilation) is tested in tests/test_estimators.py.
TUNED = {"RELAX": {"RELAX.eta": 0.7, "RELAX.log_temperature_scale": 0.3}}


# ----------------------------------------------------------------------------- the documented refusals


def _guide_depends(spec, child, ancestor):
    """Whether the guide's distribution of ``child`` depends on the value of ``ancestor`` (through
    guide sites in between)."""
    stack, seen = [child], set()
    while stack:
        latent = spec.latent(stack.pop())
        for parent, _ in latent.guide_parents:
            if parent == ancestor:
                return True
            if parent not in seen:
                seen.add(parent)
                stack.append(parent)
    return False


def expected_refusals(name, spec):
    """The refusals the loss's documentation gives for this model: {reason: message pattern}; empty
    where it accepts the model."""
    reasons = {}
    graph = LOSSES[name][0]
    guide = [lt for lt in spec.latents if lt.in_guide]
    model_only = [lt for lt in spec.latents if lt.in_model and not lt.in_guide]
    used_inner = any(site.level == "inner" for site in spec.latents + spec.observed)  # a plate no site is in subsamples nothing
    subsampled = [p for p, s in (("data", spec.subsample), ("inner", spec.inner_subsample if used_inner else None)) if s]
    if spec.plate is not None:
        for latent in guide:
            if latent.level == "global":
                reasons[f"{latent.name} outside the plate"] = rf"site '{latent.name}' is outside plate 'data'"
    if name in ESTIMATORS:
        relaxed = [lt for lt in guide if lt.relaxed]
        if not relaxed:
            reasons["no relaxed guide site"] = "the guide has no Concrete-family site"
        for latent in model_only:
            if latent.relaxed:
                reasons[f"{latent.name} of the model only"] = rf"site '{latent.name}' \({latent.node}\) is a discrete latent of the model"
        if name == "DisARM":
            for latent in relaxed:
                if latent.kind == "categorical":
                    reasons[f"{latent.name} categorical"] = rf"site '{latent.name}' is categorical; DisARM is for binary sites"
        if name == "GumbelRao":
            for latent in relaxed:
                if latent.node in random_models.LOG_SPACE:
                    reasons[f"{latent.name} log-space"] = rf"a {latent.node} site's straight-through value"
        else:
            for child in relaxed:
                for parent in relaxed:
                    if child is not parent and _guide_depends(spec, child.name, parent.name):
                        reasons[f"{child.name} depends on {parent.name}"] = "a relaxed site's distribution depends on the value of another relaxed site"
        return reasons
    m = spec.particles if LOSSES[name][2] == "bound" else 1
    if graph == "discrete" and spec.plate is not None:
        for latent in model_only:
            if latent.relaxed and latent.level == "global":  # its score term cannot be split between elements
                reasons[f"{latent.name} outside the plate"] = rf"site '{latent.name}' is outside plate 'data'"
    if m > 1 and subsampled:
        if spec.plate is None:
            reasons["joint bound of a subsample"] = rf"plate '{subsampled[0]}' subsamples its elements, but with plate=None"
        elif "inner" in subsampled:
            reasons["inner plate subsampled"] = "plate 'inner' subsamples its elements inside the elements of plate 'data'"
    return reasons


# ----------------------------------------------------------------------------- running a loss


@dataclass
class Outcome:
    backend: str
    loss: str
    kind: str  # unbiased, refused, or a third outcome
    detail: str = ""
    worst_z: float = 0.0
    zs: dict = field(default_factory=dict)

    @property
    def third(self):
        return self.kind not in ("unbiased", "refused", "unavailable")


def _versions(backend, spec, graph):
    model, guide = random_models.build(spec, backend)
    if graph == "discrete":
        return backend.lib.discrete(model), backend.lib.discrete(guide)
    return model, guide


def _run(backend, name, spec, seeds):
    """(values (S,), {parameter: gradients (S, ...)}) of the loss at the initial parameters."""
    backend.reset()
    loss = make_loss(backend, name, spec)
    model, guide = _versions(backend, spec, LOSSES[name][0])
    guide = loss.guide(guide) if name == "RELAX" else guide
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return backend.loss_samples(model, guide, loss=loss, seeds=seeds, at=TUNED.get(name), fast=True)


def _refusal(error, name):
    """The refusal message, if ``error`` is the loss's ValueError (NumPyro raises the one-layer check
    from the compiled step: a JAX runtime error carrying the ValueError's message)."""
    text = str(error)
    if isinstance(error, ValueError) and text.startswith(f"{name}:"):
        return text
    found = re.search(rf"ValueError: ({re.escape(name)}: .*)", text)
    if found and "Runtime" in type(error).__name__:
        return found.group(1)
    return None


def _z_scores(values, grads, ref):
    """{quantity: z} of the mean value and mean gradient against the reference."""
    zs = {}

    def check(label, samples, expected, expected_se):
        samples = np.asarray(samples, dtype=float)
        mean = samples.mean(0)
        # the standard errors, and a resolution of 1e-3 relative: an estimator whose draws are almost
        # all alike keeps part of its mean in events rarer than one in the draws, which the sample
        # variance misses (DisARM at a logit of -7e-4, case 330: b = b~ in one draw of 2800, the
        # mean 8.6e-4 off by that alone, the draws' variance 0); the biases this harness is for are
        # orders of magnitude larger (issue 29's: factors of the subsample's scale, zeros, signs)
        numerical = 1e-3 * np.maximum(1.0, np.abs(expected))
        se = np.sqrt(samples.var(0, ddof=1) / len(samples) + np.asarray(expected_se) ** 2 + numerical**2)
        z = np.abs(mean - expected) / se
        for index in np.ndindex(np.shape(z)):
            zs[f"{label}{list(index) if index else ''}"] = float(np.asarray(z)[index])

    check("value", values, ref.value, ref.value_se)
    for parameter, expected in ref.gradient.items():
        check(f"d/d{parameter}", grads[parameter], expected, ref.gradient_se[parameter])
    return zs


class Case:
    """One generated model, its references (computed once, as the losses need them) and the outcome
    of every loss in every backend."""

    def __init__(self, seed, seeds=None, backends=BACKEND_NAMES, spec=None):
        self.seed, self.seeds = seed, seeds or SEEDS
        self.spec = spec or random_models.generate(seed)
        self.params = random_models.initial_params(self.spec)
        self.backends = [load_backend(name) for name in backends]
        self._references = {}
        self.outcomes = []

    def reference(self, name):
        _, graph, estimates = LOSSES[name]
        spec = self.spec
        key = (graph, estimates)
        if key not in self._references:
            try:
                if estimates == "straight_through":
                    ref = exact_objectives.expected_straight_through(spec, self.params, seed=self.seed, draws=REFERENCE_DRAWS)
                else:
                    m = spec.particles if estimates == "bound" else 1
                    ref = exact_objectives.expected_loss(spec, self.params, graph, m, joint=spec.plate is None, seed=self.seed, draws=REFERENCE_DRAWS)
            except exact_objectives.Unavailable as why:
                ref = why
            self._references[key] = ref
        return self._references[key]

    def threshold(self):
        """The |z| beyond which a check fails: Bonferroni over the case's checks."""
        checks = 1 + sum(np.size(v) for v in self.params.values())
        runs = sum(len(losses_of(b)) for b in self.backends)
        return float(stats.norm.isf(FALSE_FAILURE / (2 * checks * runs)))

    def run(self, verbose=False):
        threshold = self.threshold()
        for backend in self.backends:
            for name in losses_of(backend):
                self.outcomes.append(self._outcome(backend, name, threshold, verbose))
        return self.outcomes

    def _outcome(self, backend, name, threshold, verbose):
        expected = expected_refusals(name, self.spec)
        count = self.seeds[backend.name]
        try:
            values, grads = _run(backend, name, self.spec, range(1, count + 1))
        except Exception as error:  # noqa: BLE001 -- classified below
            message = _refusal(error, name)
            if message is None:
                return Outcome(backend.name, name, "crashed", f"{type(error).__name__}: {str(error)[:300]}")
            if not any(re.search(pattern, message) for pattern in expected.values()):
                return Outcome(backend.name, name, "refused-unexpectedly", message[:300])
            return Outcome(backend.name, name, "refused", message[:200])
        if expected:
            return Outcome(backend.name, name, "accepted-unexpectedly", "; ".join(expected))
        if not (np.all(np.isfinite(values)) and all(np.all(np.isfinite(g)) for g in grads.values())):
            return Outcome(backend.name, name, "non-finite")
        ref = self.reference(name)
        if isinstance(ref, exact_objectives.Unavailable):
            return Outcome(backend.name, name, "unavailable", str(ref))
        zs = _z_scores(values, grads, ref)
        worst = max(zs.values())
        drawn = count
        for stage in (4, 20):  # the later stages: fresh draws, four and twenty times as many
            if worst <= threshold:
                break
            values, grads = _run(backend, name, self.spec, range(drawn + 1, drawn + stage * count + 1))
            drawn += stage * count
            zs = _z_scores(values, grads, ref)
            worst = max(zs.values())
        if worst > threshold:
            top = sorted(zs.items(), key=lambda item: -item[1])[:3]
            detail = ", ".join(f"{label} z={z:.1f}" for label, z in top)
            return Outcome(backend.name, name, "biased", detail, worst, zs)
        if verbose:
            print(f"    {backend.name} {name}: " + ", ".join(f"{k} {v:.2f}" for k, v in zs.items()))
        return Outcome(backend.name, name, "unbiased", "", worst, zs)


# ----------------------------------------------------------------------------- the sweep


def run_case(seed, backends=BACKEND_NAMES, verbose=False):
    """One case, summarized: {"case", "spec", "seconds", "outcomes": [{backend, loss, kind, detail, worst_z}]}."""
    began = time.time()
    case = Case(seed, backends=backends)
    outcomes = case.run(verbose=verbose)
    return {
        "case": seed, "spec": case.spec.describe(), "seconds": round(time.time() - began, 1), "machine": machine_line(),
        "outcomes": [{"backend": o.backend, "loss": o.loss, "kind": o.kind, "detail": o.detail, "worst_z": round(o.worst_z, 2)} for o in outcomes],
    }


def _worker_setup():
    import jax

    jax.config.update("jax_enable_x64", True)
    warnings.simplefilter("ignore")


def _cases(seeds, jobs, backends, verbose):
    """The summaries of the cases, in order; ``jobs`` processes side by side."""
    if jobs == 1:
        _worker_setup()
        for seed in seeds:
            yield run_case(seed, backends, verbose)
        return
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("spawn"), initializer=_worker_setup) as pool:
        yield from pool.map(run_case, seeds, [backends] * len(seeds), [verbose] * len(seeds))


REASONS = {  # a refusal's message -> the rule it applies (the table of docs/estimators.rst)
    "outside plate": r"is outside plate",
    "one stochastic layer": r"depends on the value of another relaxed site",
    "categorical site (DisARM)": r"is categorical; DisARM",
    "log-space node (Gumbel-Rao)": r"straight-through value",
    "discrete latent of the model only": r"is a discrete latent of the model",
    "no relaxed guide site": r"has no Concrete-family site",
    "bound of a subsample, plate=None": r"but with plate=None the bound",
    "bound of a subsample, nested plate": r"inside the elements of plate",
}


def _reason(message):
    return next((reason for reason, pattern in REASONS.items() if re.search(pattern, message)), message[:80])


def report(summaries, seconds=None, command=None):
    """The sweep's result as text: per loss and backend, how many cases were unbiased, refused (by
    rule) or had no exact value within the budget, and every third outcome."""
    table: dict = {}
    reasons: dict = {}
    thirds = []
    for summary in summaries:
        for outcome in summary["outcomes"]:
            row = table.setdefault((outcome["loss"], outcome["backend"]), {})
            row[outcome["kind"]] = row.get(outcome["kind"], 0) + 1
            if outcome["kind"] == "refused":
                key = (outcome["loss"], _reason(outcome["detail"]))
                reasons[key] = reasons.get(key, 0) + 1
            elif outcome["kind"] not in ("unbiased", "unavailable"):
                thirds.append((summary["case"], outcome))
    lines = [f"# {command}"] if command else []
    machines: dict = {}  # where each case ran (a case from before the field: the machine of the report)
    for summary in summaries:
        machines.setdefault(summary.get("machine") or machine_line(), []).append(summary["case"])
    for machine, cases in machines.items():
        lines.append(f"# {_ranges(cases)}: {machine}" if len(machines) > 1 else f"# {machine}")
    lines.append(f"# {len(summaries)} cases" + (f" in {seconds / 3600:.1f} h" if seconds else "")
                 + f"; draws per loss: {SEEDS} at the first stage, four times as many fresh ones at the second, twenty times at the third")
    lines += ["", "| loss | backend | unbiased | refused | no exact value | third outcomes |", "|---|---|---|---|---|---|"]
    for (loss, backend), row in table.items():
        third = sum(count for kind, count in row.items() if kind not in ("unbiased", "refused", "unavailable"))
        lines.append(f"| {loss} | {backend} | {row.get('unbiased', 0)} | {row.get('refused', 0)} | {row.get('unavailable', 0)} | {third} |")
    lines += ["", "Refusals by rule (both backends):", ""]
    for (loss, reason), count in sorted(reasons.items()):
        lines.append(f"- {loss}: {reason}: {count}")
    lines += ["", f"Third outcomes: {len(thirds)}"]
    for case, outcome in thirds:
        lines.append(f"- case {case}: {outcome['backend']} {outcome['loss']}: {outcome['kind']}: {outcome['detail']}")
    return "\n".join(lines) + "\n"


def _ranges(cases):
    """"cases 0-99, 120-130" of a list of case numbers."""
    cases, spans = sorted(cases), []
    for case in cases:
        if spans and case == spans[-1][1] + 1:
            spans[-1][1] = case
        else:
            spans.append([case, case])
    return "cases " + ", ".join(f"{a}-{b}" if a != b else f"{a}" for a, b in spans)


@functools.lru_cache(maxsize=None)
def machine_line():
    import platform

    import jax
    import numpyro
    import pyro
    import torch

    return (f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}; torch {torch.__version__}, "
            f"pyro {pyro.__version__}, jax {jax.__version__}, numpyro {numpyro.__version__}")


def _read(path):
    """The summaries in a sweep's JSON lines (``.gz``: compressed, as committed)."""
    with (gzip.open(path, "rt") if path.endswith(".gz") else open(path)) as f:
        return [json.loads(line) for line in f if line.strip()]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", type=int, default=20, help="how many cases, from --start")
    parser.add_argument("--start", type=int, default=0)
    parser.add_argument("--case", type=int, default=None, help="one case")
    parser.add_argument("--jobs", type=int, default=1, help="processes side by side (one thread each)")
    parser.add_argument("--backend", choices=BACKEND_NAMES, action="append", help="only these backends")
    parser.add_argument("--out", default=None, help="append one JSON line per case here (the cases already there are skipped: a sweep resumes)")
    parser.add_argument("--report", default=None, help="write the report (the table of outcomes) here")
    parser.add_argument("--from-jsonl", nargs="+", default=None, help="no runs: the report of the cases in these files (--out of sweeps)")
    parser.add_argument("--verbose", action="store_true")
    args = parser.parse_args(argv)
    if args.from_jsonl:
        summaries = [summary for path in args.from_jsonl for summary in _read(path)]
        text = report(summaries, command=f"python -m tests.fuzz_estimators {' '.join(argv or sys.argv[1:])}")
        print(text, end="")
        if args.report:
            with open(args.report, "w") as f:
                f.write(text)
        return 0
    if args.jobs > 1:
        for variable in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
            os.environ.setdefault(variable, "1")
        os.environ.setdefault("XLA_FLAGS", "--xla_cpu_multi_thread_eigen=false")
    seeds = [args.case] if args.case is not None else list(range(args.start, args.start + args.cases))
    summaries = _read(args.out) if args.out and os.path.exists(args.out) else []
    done = {summary["case"] for summary in summaries}
    summaries = [summary for summary in summaries if summary["case"] in seeds]
    seeds = [seed for seed in seeds if seed not in done]
    start = time.time()
    for summary in _cases(seeds, args.jobs, tuple(args.backend or BACKEND_NAMES), args.verbose):
        summaries.append(summary)
        outcomes = summary["outcomes"]
        for outcome in outcomes:
            if outcome["kind"] not in ("unbiased", "refused", "unavailable"):
                print(f"  THIRD OUTCOME case {summary['case']} {outcome['backend']} {outcome['loss']}: {outcome['kind']}: {outcome['detail']}", flush=True)
        line = " ".join(f"{o['backend'][0]}:{o['loss']}={o['kind']}" for o in outcomes)
        print(f"case {summary['case']} ({summary['seconds']:.0f} s): {summary['spec']}\n  {line}", flush=True)
        if args.out:
            with open(args.out, "a") as f:
                f.write(json.dumps(summary) + "\n")
    text = report(summaries, time.time() - start, command=f"python -m tests.fuzz_estimators {' '.join(argv or sys.argv[1:])}")
    print("\n" + text, end="")
    if args.report:
        with open(args.report, "w") as f:
            f.write(text)
    return 1 if "Third outcomes: 0" not in text else 0


if __name__ == "__main__":
    sys.exit(main())
