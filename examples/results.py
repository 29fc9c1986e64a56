"""The runs behind the README's result tables: their exact commands, running them, and the tables.

    python -m examples.results list                 # every run and its command
    python -m examples.results run [--only TEXT]    # run the missing ones, one after another, into runs/
    python -m examples.results collect              # copy runs/*/metrics.json into examples/results/
    python -m examples.results table                # the README tables, from examples/results/
    python -m examples.results compare --runs-dir D [--only TEXT]   # runs in D against the committed results

A run that was interrupted is resumed from its checkpoint; a run with a metrics.json is skipped.
Runs get one torch thread (``OMP_NUM_THREADS=1``): two queues share the 2 cores here, and torch's
intra-op threads on a busy CPU make these small networks' steps many times slower.
"""

import argparse
import glob
import json
import os
import shutil
import subprocess
import sys
from collections import defaultdict
from dataclasses import dataclass

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
RESULTS = os.path.join(HERE, "results")

FMNIST = ["--dataset", "fashion-mnist", "--lr", "3e-4", "--batch-size", "64", "--eval-samples", "100",
          "--eval-every", "5000", "--checkpoint-every", "5000"]
DIGITS = ["--steps", "20000", "--eval-samples", "1000", "--eval-every", "2000", "--checkpoint-every", "5000"]


def _runs():
    runs = {}
    for ppl in ("numpyro", "pyro"):
        # Fashion-MNIST (200H~784V): the paper's binary model, m = 1 and 5, 100k steps
        for m in (1, 5):
            runs[f"fmnist-dvae-{ppl}-binary-m{m}"] = (f"dvae_{ppl}", FMNIST + ["--steps", "100000", "--particles", str(m)])
        # the 8x8 digits: arity x m x estimator
        for arity in (2, 4, 8):
            for m in (1, 5):
                runs[f"digits-dvae-{ppl}-{arity}ary-m{m}"] = (f"dvae_{ppl}", DIGITS + ["--arity", str(arity), "--particles", str(m)])
            runs[f"digits-dvae-{ppl}-{arity}ary-reinforce"] = (f"dvae_{ppl}", DIGITS + ["--arity", str(arity), "--estimator", "reinforce"])
            runs[f"digits-dvae-{ppl}-{arity}ary-vimco5"] = (
                f"dvae_{ppl}", DIGITS + ["--arity", str(arity), "--estimator", "reinforce", "--particles", "5"])
            # the discrete graph's gradient built on the relaxation (issue 15): DisARM is for binary nodes
            for estimator in ("rebar", "relax", "gumbel-rao") + (("disarm",) if arity == 2 else ()):
                runs[f"digits-dvae-{ppl}-{arity}ary-{estimator}"] = (
                    f"dvae_{ppl}", DIGITS + ["--arity", str(arity), "--estimator", estimator])
        # structured prediction
        for m in (1, 5):
            runs[f"digits-structured-{ppl}-m{m}"] = (f"structured_{ppl}", ["--steps", "10000", "--particles", str(m)])
            runs[f"fmnist-structured-{ppl}-m{m}"] = (
                f"structured_{ppl}", ["--dataset", "fashion-mnist", "--steps", "50000", "--particles", str(m), "--eval-every", "5000"])
        # pruning with Hard Concrete gates (issue 7's example): three L0 strengths
        for l0 in (3, 20, 100):
            runs[f"digits-l0-{ppl}-lambda{l0}"] = (f"l0_{ppl}", ["--l0", str(l0)])
        # the mixture: relaxed vs exact enumeration, five seeds
        for training in ("relaxed", "enumerate"):
            for seed in range(5):
                runs[f"digits-mixture-{ppl}-{training}-seed{seed}"] = (f"mixture_{ppl}", ["--training", training, "--seed", str(seed)])
                # the tutorial shapes: continuous and discrete latents (Iris), a markov chain (the digits' rows)
                runs[f"iris-gmm-{ppl}-{training}-seed{seed}"] = (f"gmm_{ppl}", ["--training", training, "--seed", str(seed)])
            runs[f"digits-hmm-{ppl}-{training}"] = (f"hmm_{ppl}", ["--training", training])
    # the discrete graph's gradient built on the relaxation, Fashion-MNIST binary m = 1: REBAR and DisARM
    # in both PPLs, RELAX and Gumbel-Rao in NumPyro (the faster one here)
    for ppl, estimators in (("numpyro", ("rebar", "disarm", "relax", "gumbel-rao")), ("pyro", ("rebar", "disarm"))):
        for estimator in estimators:
            runs[f"fmnist-dvae-{ppl}-binary-{estimator}"] = (f"dvae_{ppl}", FMNIST + ["--steps", "100000", "--estimator", estimator])
    # beyond m = 1 (NumPyro, the faster one here): REINFORCE, 4-ary nodes, a longer run
    runs["fmnist-dvae-numpyro-binary-reinforce"] = ("dvae_numpyro", FMNIST + ["--steps", "100000", "--estimator", "reinforce"])
    runs["fmnist-dvae-numpyro-4ary-m1"] = ("dvae_numpyro", FMNIST + ["--steps", "100000", "--arity", "4"])
    runs["fmnist-dvae-numpyro-binary-m5-300k"] = ("dvae_numpyro", FMNIST + ["--steps", "300000", "--particles", "5"])
    # the order they run in: the short ones and the required Fashion-MNIST m = 1 runs first
    first = ["fmnist-dvae-numpyro-binary-m1", "digits-", "fmnist-dvae-pyro-binary-m1", "fmnist-dvae-numpyro-binary-m5",
             "fmnist-dvae-pyro-binary-m5", "fmnist-structured-", "fmnist-dvae-numpyro-binary-reinforce"]

    def rank(name):  # an entry ending in "-" is a prefix, any other a whole name
        matches = (name.startswith(e) if e.endswith("-") else name == e for e in first)
        return next((i for i, match in enumerate(matches) if match), len(first))

    return dict(sorted(runs.items(), key=lambda item: rank(item[0])))


RUNS = _runs()


def command(name, runs_dir):
    module, options = RUNS[name]
    return [sys.executable, "-m", f"examples.{module}", *options, "--no-progress", "--out", os.path.join(runs_dir, name)]


def run(only, runs_dir):
    for name in RUNS:
        if only and only not in name:
            continue
        out = os.path.join(runs_dir, name)
        if os.path.exists(os.path.join(out, "metrics.json")):
            continue
        cmd = command(name, runs_dir) + (["--resume"] if os.path.exists(os.path.join(out, "checkpoint.bin")) else [])
        print("$", " ".join(cmd[1:]), flush=True)
        with open(os.path.join(runs_dir, f"{name}.log"), "a") as log:
            env = {**os.environ, "OMP_NUM_THREADS": "1"}
            subprocess.run(cmd, cwd=os.path.dirname(HERE), stdout=log, stderr=subprocess.STDOUT, check=False, env=env)


def collect(runs_dir):
    os.makedirs(RESULTS, exist_ok=True)
    for path in sorted(glob.glob(os.path.join(runs_dir, "*", "metrics.json"))):
        name = os.path.basename(os.path.dirname(path))
        if name in RUNS:
            shutil.copy(path, os.path.join(RESULTS, f"{name}.json"))


def _load(results_dir):
    out = {}
    for path in glob.glob(os.path.join(results_dir, "*.json")):
        with open(path) as f:
            out[os.path.basename(path)[: -len(".json")]] = json.load(f)
    return out


def minutes(seconds):
    return f"{seconds / 60:.1f} min" if seconds >= 60 else f"{seconds:.0f} s"


_ESTIMATOR_NAMES = {"concrete": "Concrete", "rebar": "REBAR", "relax": "RELAX", "gumbel-rao": "Gumbel-Rao", "disarm": "DisARM"}


def objective(metrics):
    """A discrete VAE run's training objective, e.g. "Concrete, L_5", "VIMCO, L_5"."""
    estimator = metrics["estimator"]
    if estimator == "reinforce":
        name = "REINFORCE" if metrics["particles"] == 1 else "VIMCO"
    else:
        name = _ESTIMATOR_NAMES[estimator]
    return f"{name}, L_{metrics['particles']}"


def training_label(training):
    return "relaxed (Concrete, SVI)" if training == "relaxed" else "exact enumeration (TraceEnum_ELBO)"


def runs_of(results, prefix):
    """(name, metrics) of the runs whose name starts with ``prefix``, by name."""
    return [(name, m) for name, m in sorted(results.items()) if name.startswith(prefix)]


def _seed_rows(runs, keys):
    """One row per (PPL, training): mean ± sd over the seeds of each of ``keys``, and the seeds."""
    groups = defaultdict(list)
    for _, m in runs:
        groups[(m["backend"], m["training"])].append(m)

    def stat(ms, key):
        values = np.array([m[key] for m in ms])
        return f"{values.mean():.3f} ± {values.std(ddof=1) if len(values) > 1 else 0:.3f}"

    return [[backend, training_label(training)] + [stat(ms, key) for key in keys] + [str(len(ms))]
            for (backend, training), ms in sorted(groups.items())]


@dataclass
class Table:
    """One results table: ``key`` names it (the docs' ``_generated/{key}.inc``), ``prefix`` the
    committed runs it reads (``examples/results/{prefix}*.json``)."""

    key: str
    prefix: str
    caption: str
    header: list
    rows: list


def tables(results):
    """The results tables of the committed runs ``results`` ({run name: metrics}), the one source of
    ``table`` (Markdown) and of the documentation's example pages (``docs/figures.py``)."""
    l0_runs = sorted(runs_of(results, "digits-l0"), key=lambda item: (item[1]["backend"], item[1]["l0"]))
    return [
        Table("dvae_digits", "digits-dvae-",
              "Discrete VAE, 8x8 digits, (200H~64V) (240H for 8-ary), 20k steps: test NLL = -L_1000 of the discrete "
              "graph; validation -L_1 = the discrete graph's ELBO on 1000 validation images",
              ["PPL", "nodes", "objective", "test NLL (nats)", "validation -L_1 at the end", "training time", "ms/step"],
              [[m["backend"], f"{m['arity']}-ary", objective(m), f"{m['test_nll']:.2f}", f"{m['validation'][-1][1]:.2f}",
                minutes(m["train_seconds"]), f"{1000 * m['seconds_per_step']:.2f}"] for _, m in runs_of(results, "digits-dvae")]),
        Table("dvae_fmnist", "fmnist-dvae-",
              "Discrete VAE, Fashion-MNIST, (200H~784V): test NLL = -L_100 of the discrete graph over the 10k test "
              "images; validation -L_1 on 1000 validation images",
              ["PPL", "nodes", "objective", "steps", "test NLL (nats)", "validation -L_1 at the end", "training time", "ms/step"],
              [[m["backend"], f"{m['arity']}-ary", objective(m), f"{m['steps'] // 1000}k", f"{m['test_nll']:.2f}",
                f"{m['validation'][-1][1]:.2f}", minutes(m["train_seconds"]), f"{1000 * m['seconds_per_step']:.2f}"]
               for _, m in runs_of(results, "fmnist-dvae")]),
        Table("structured", "{digits,fmnist}-structured-",
              "Structured prediction (bottom half from top half), linear, 2 x 240 binary nodes: test -L_100^SP of the "
              "discrete graph",
              ["data", "PPL", "objective", "steps", "test -L_100^SP (nats)", "training time"],
              [[m["dataset"], m["backend"], f"L_{m['particles']}^SP", f"{m['steps'] // 1000}k", f"{m['test_nll']:.2f}",
                minutes(m["train_seconds"])]
               for _, m in runs_of(results, "digits-structured") + runs_of(results, "fmnist-structured")]),
        Table("mixture", "digits-mixture-",
              "Bernoulli mixture of the binarized 8x8 digits, K = 10, 3000 steps: mean ± sd over the seeds",
              ["PPL", "training", "test log p(x) per image (exact)", "MAP accuracy", "MAP ARI", "seeds"],
              _seed_rows(runs_of(results, "digits-mixture"), ["test_log_likelihood", "accuracy", "ari"])),
        Table("gmm", "iris-gmm-",
              "Gaussian mixture of the Iris flowers (Pyro's GMM tutorial model: latent weights, locations, scales with "
              "an AutoNormal guide), K = 3, 2000 steps: log p(x | globals at the guide's median), exact; mean ± sd over "
              "the seeds",
              ["PPL", "training", "log p(x | globals) per flower", "MAP accuracy (species)", "MAP ARI", "seeds"],
              _seed_rows(runs_of(results, "iris-gmm"), ["log_likelihood", "accuracy", "ari"])),
        Table("hmm", "digits-hmm-",
              "Hidden Markov model of the 8x8 digits read row by row, 8 states, 3000 steps: test log p(x) by the "
              "forward algorithm (exact), Viterbi paths",
              ["PPL", "training", "test log p(x) per image (exact)", "pixels the Viterbi states reconstruct",
               "states used", "training time"],
              [[m["backend"], training_label(m["training"]), f"{m['test_log_likelihood']:.2f}",
                f"{m['viterbi_pixel_accuracy']:.3f}", str(m["states_used"]), minutes(m["train_seconds"])]
               for _, m in runs_of(results, "digits-hmm")]),
        Table("l0", "digits-l0-",
              "Pruning a 64-100-10 classifier of the 8x8 digits with Hard Concrete gates, 3000 steps: deterministic "
              "test-time gates",
              ["PPL", "lambda (nats per open gate)", "open gates (of 100)", "expected L0", "test accuracy", "training time"],
              [[m["backend"], f"{m['l0']:g}", str(m["active_gates"]), f"{m['expected_l0']:.1f}", f"{m['test_accuracy']:.3f}",
                minutes(m["train_seconds"])] for _, m in l0_runs]),
    ]


def _markdown(cell):
    return str(cell).replace("|", "\\|")


def table(results_dir):
    """Print ``tables`` in Markdown, and the runs not yet committed."""
    results = _load(results_dir)
    for i, t in enumerate(tables(results)):
        if i:
            print()
        print(_markdown(t.caption))
        print("| " + " | ".join(_markdown(h) for h in t.header) + " |")
        print("|" + "---|" * len(t.header))
        for row in t.rows:
            print("| " + " | ".join(_markdown(c) for c in row) + " |")
    missing = [name for name in RUNS if name not in results]
    if missing:
        print()
        print(f"Not run yet ({len(missing)} of {len(RUNS)}): " + ", ".join(f"`{name}`" for name in missing))


def compare(only, runs_dir, results_dir):
    """Each run of ``runs_dir`` beside its committed result: test NLL and last validation -L_1 of the
    discrete graph, and their differences (a rerun of the same command, e.g. after a refactoring)."""
    committed, rerun = _load(results_dir), {}
    for path in sorted(glob.glob(os.path.join(runs_dir, "*", "metrics.json"))):
        name = os.path.basename(os.path.dirname(path))
        if name in committed and (not only or only in name):
            with open(path) as f:
                rerun[name] = json.load(f)
    print("| run | test NLL committed | rerun | difference | validation -L_1 committed | rerun | difference |")
    print("|---|---|---|---|---|---|---|")
    for name, m in rerun.items():
        c = committed[name]
        cv, rv = c["validation"][-1][1], m["validation"][-1][1]
        print(f"| {name} | {c['test_nll']:.3f} | {m['test_nll']:.3f} | {m['test_nll'] - c['test_nll']:+.3f} | "
              f"{cv:.2f} | {rv:.2f} | {rv - cv:+.2f} |")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("action", choices=["list", "run", "collect", "table", "compare"])
    parser.add_argument("--only", default=None, help="run only the runs whose name contains this")
    parser.add_argument("--runs-dir", default="runs")
    parser.add_argument("--results-dir", default=RESULTS)
    args = parser.parse_args(argv)
    if args.action == "list":
        for name in RUNS:
            print(f"{name}: {' '.join(command(name, args.runs_dir)[1:])}")
    elif args.action == "run":
        os.makedirs(args.runs_dir, exist_ok=True)
        run(args.only, args.runs_dir)
    elif args.action == "collect":
        collect(args.runs_dir)
    elif args.action == "compare":
        compare(args.only, args.runs_dir, args.results_dir)
    else:
        table(args.results_dir)


if __name__ == "__main__":
    main()
