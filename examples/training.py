"""What every example script shares and that has nothing to do with the PPL: command-line options
and their checks, atomic checkpoints and what --resume accepts, stopping cleanly on SIGINT/SIGTERM,
the progress bar, metrics and plots."""

import argparse
import contextlib
import json
import math
import os
import signal
import sys
import tempfile
import time
from dataclasses import dataclass, field

import numpy as np


@dataclass
class History:
    """A run's record, in both PPLs' checkpoints (``pyro_training.fit``, ``numpyro_training.fit``)."""

    step: int = 0
    losses: list = field(default_factory=list)  # one per step, per data point
    evaluations: list = field(default_factory=list)  # (step, value)
    seconds: float = 0.0  # training wall time, without evaluation and checkpoints


def _integer_at_least(text, least, what, why=""):
    """``text`` as an integer >= ``least``, or argparse's one-line error naming ``what`` it must be."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
    if value < least:
        raise argparse.ArgumentTypeError(f"must be {what} ({least} or more{why}), got {value}")
    return value


def positive_int(text):
    """An argparse ``type``: an integer >= 1 (counts of steps, samples, units), so that 0 or a negative
    value is argparse's one-line "argument --x: ..." error (exit status 2), not a ZeroDivisionError or
    an empty loop later."""
    return _integer_at_least(text, 1, "a positive integer")


def non_negative_int(text):
    """An argparse ``type``: an integer >= 0 (a seed: JAX's keys take no negative one)."""
    return _integer_at_least(text, 0, "a non-negative integer")


def categories(text):
    """An argparse ``type``: a number of categories of a Concrete site (components, states): an
    integer >= 2 (one category has no Concrete distribution), checked before training starts."""
    return _integer_at_least(text, 2, "a number of categories", ": a Concrete site needs two")


def non_negative_float(text):
    """An argparse ``type``: a finite number >= 0 (a penalty: a negative one would reward what it
    charges for)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a non-negative number, got {text!r}") from None
    if not (math.isfinite(value) and value >= 0):
        raise argparse.ArgumentTypeError(f"must be a finite number of 0 or more, got {text}")
    return value


def positive_float(text):
    """An argparse ``type``: a finite number > 0 (learning rates, temperatures); nan, inf, 0 and
    negative values are argparse's one-line error."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}") from None
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"must be a finite number greater than 0, got {text}")
    return value


def device_name(text):
    """An argparse ``type``: where to train, ``cpu``, ``cuda`` (or ``gpu``, the same) or ``cuda:N``,
    returned as ``cpu``, ``cuda`` or ``cuda:N``; anything else is argparse's one-line error, not a
    torch or JAX traceback once the data are loaded. Whether the machine has it is the PPL loop's
    check (``pyro_training.torch_device``, ``numpyro_training.use_platform``)."""
    kind, _, index = text.strip().lower().partition(":")
    kind = {"gpu": "cuda"}.get(kind, kind)
    if kind not in ("cpu", "cuda") or (index and (kind == "cpu" or not index.isdigit())):
        raise argparse.ArgumentTypeError(f"expected cpu, cuda (or gpu) or cuda:N, got {text!r}")
    return f"{kind}:{int(index)}" if index else kind


def common_arguments(parser, *, steps, batch_size, lr):
    """The options every example takes. Counts and rates are checked by their ``type``
    (``positive_int``, ``positive_float``); the examples' own such options use the same two."""
    parser.add_argument("--seed", type=non_negative_int, default=0)
    parser.add_argument("--steps", type=positive_int, default=steps, help="optimization steps")
    parser.add_argument("--batch-size", type=positive_int, default=batch_size)
    parser.add_argument("--lr", type=positive_float, default=lr, help="Adam learning rate")
    parser.add_argument("--device", type=device_name, default=None,
                        help="cpu, cuda (or gpu) or cuda:N (default: a GPU if there is one)")
    parser.add_argument("--out", default=None,
                        help="directory for metrics.json, plots and checkpoints; one that already holds a run's "
                             "checkpoint.bin or metrics.json is refused unless --resume continues it")
    parser.add_argument("--checkpoint-every", type=positive_int, default=1000, help="steps between checkpoints (needs --out)")
    parser.add_argument("--resume", action="store_true",
                        help="continue from the checkpoint in --out, with the options it was saved with but for "
                             "those of " + ", ".join(sorted(f"--{name.replace('_', '-')}" for name in RESUME_MAY_CHANGE - {"resume"}))
                             + " this script takes")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    return parser


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """The module docstring as written; defaults shown where an option has one."""

    def _get_help_string(self, action):
        if action.default is None:
            return action.help
        return super()._get_help_string(action)


def parser_for(description):
    return argparse.ArgumentParser(description=description, formatter_class=_HelpFormatter)


def parse(parser, argv, read_checkpoint):
    """``parser.parse_args(argv)`` (whose ``type`` checks reject bad counts and rates), then the
    checks that need neither data nor model, so that a run that could not save, could not resume,
    or would overwrite another fails at once, not after loading data or training (each failure is
    one line, exit status 2). Without ``--resume``: ``--out`` holds no run yet (``check_new_out``)
    and is (or is now created as) a writable directory. With ``--resume``: ``--out`` is an existing
    writable directory and ``read_checkpoint(path, args)`` (the PPL loop's, which calls
    ``load_checkpoint``) reads the checkpoint there and checks its options against these; nothing
    is created, so a --resume that fails leaves no new directory behind."""
    args = parser.parse_args(argv)
    if args.resume:
        check_out(args.out, create=False)
        read_checkpoint(checkpoint_path(args.out), args)
    else:
        check_new_out(args.out)
        check_out(args.out)
    return args


# the estimators of the discrete VAE (--estimator): the relaxation itself, the score function with a
# learned baseline (VIMCO at m > 1), and the discrete graph's gradient built on the relaxation
ESTIMATORS = ["concrete", "reinforce", "rebar", "relax", "gumbel-rao", "disarm"]


def check_estimator(args):
    """The combinations the estimators support, checked before any data is loaded: REBAR, RELAX,
    Gumbel-Rao and DisARM at m = 1; the unbiased three with one stochastic layer; DisARM on binary
    nodes."""
    if args.estimator in ("concrete", "reinforce"):
        return
    if args.particles != 1:
        fail(f"--estimator {args.estimator} trains the single-sample ELBO: use --particles 1 (got {args.particles})")
    if args.estimator != "gumbel-rao" and args.layers != 1:
        fail(f"--estimator {args.estimator} needs one stochastic layer: use --layers 1 (got {args.layers})")
    if args.estimator == "disarm" and args.arity != 2:
        fail(f"--estimator disarm is for binary nodes: use --arity 2 (got {args.arity})")


def distinct_starts(available, count, seed, option, what):
    """``count`` distinct indices of ``available`` rows (``what``: "flowers", "images", ...), drawn
    with ``seed``: where the components or states start (one row each); more of them than rows is
    ``option``'s one-line error, not NumPy's "Cannot take a larger sample" traceback."""
    if count > available:
        fail(f"{option} {count}: the data have {available} {what}, each starts at one of them")
    return np.random.default_rng(seed).choice(available, count, replace=False)


def fail(message):
    """Exit with a one-line error instead of a traceback."""
    print(f"error: {message}", file=sys.stderr)
    raise SystemExit(2)


def batches_or_fail(make):
    """``make()`` (a ``data.Batches``), or one line and exit status 2 where ``--batch-size`` exceeds
    the training examples (known only once the data are loaded)."""
    try:
        return make()
    except ValueError as error:
        fail(f"--batch-size: {error}")


def one_line(error, limit=160):
    """An exception as a short single line: its type and the start of its message."""
    text = " ".join(str(error).split())
    text = text if len(text) <= limit else text[: limit - 3] + "..."
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


def check_out(out, create=True):
    """Fail (one line) unless ``out`` is None or a directory we can write files in, creating it
    (and its parents) if it does not exist. Writability is tried with a file, not read from the
    permission bits, which do not stop root. With ``create=False`` (``--resume``) a missing ``out``
    is left missing and passes: reading the checkpoint then reports it."""
    if out is None:
        return
    if os.path.exists(out) and not os.path.isdir(out):
        fail(f"--out {out} is not a directory; give a directory (it is created if missing)")
    if not create and not os.path.isdir(out):
        return
    try:
        os.makedirs(out, exist_ok=True)
        fd, probe = tempfile.mkstemp(dir=out, prefix=".tmp-write-test-")
        os.close(fd)
        os.unlink(probe)
    except OSError as error:
        fail(f"--out {out} is not a writable directory ({error.strerror or one_line(error)})")


def check_new_out(out):
    """Fail (one line) if ``out``, for a run without ``--resume``, already holds a run: its
    checkpoint (which the first save would overwrite) or a finished run's metrics.json. The way
    forward is named: --resume to continue it, or another --out (or deleting ``out``) to start over."""
    if out is None:
        return
    checkpoint, metrics = checkpoint_path(out), os.path.join(out, "metrics.json")
    if os.path.lexists(checkpoint):
        fail(f"--out {out} already holds a run's checkpoint {checkpoint}, which this run would overwrite; "
             f"continue that run with --resume, or start a new one with another --out (or delete {out} first)")
    if os.path.lexists(metrics):
        fail(f"--out {out} already holds a finished run's {metrics}, which this run would overwrite; "
             f"start a new run with another --out (or delete {out} first)")


# ----------------------------------------------------------------------------- checkpoints

# The options that may differ between a run and its --resume: how long it trains (--steps), how and
# where it runs (--device, --devices, --no-jit, --compile, --no-progress, --out, --resume itself: --batch-size is
# the global batch, split over the devices, so their number does not change the run), how often it saves, and
# what is only evaluated (--eval-every: the validation curve; --eval-samples: m of the final test
# bound, computed after training). Every other option (shapes, data, the objective, the optimizer,
# the seed) must be the checkpoint's, or --resume refuses: training on with other ones would mix two
# runs, or fail on mismatched shapes. Argument names as in ``vars(args)``.
RESUME_MAY_CHANGE = frozenset(
    {"steps", "resume", "no_progress", "device", "devices", "no_jit", "compile", "out", "checkpoint_every", "eval_every", "eval_samples"}
)


def _umask():
    """The process's umask, read without changing it where Linux shows it (/proc), else briefly set."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def atomic_write(path, data):
    """Write ``data`` (bytes) to ``path`` so that a crash leaves either the old or the new file. The
    file gets the mode of any newly created file, 0666 & ~umask (not mkstemp's 0600)."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".tmp-", suffix=os.path.basename(path))
    try:
        with os.fdopen(fd, "wb") as f:
            os.chmod(tmp, 0o666 & ~_umask())
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def checkpoint_path(out):
    return None if out is None else os.path.join(out, "checkpoint.bin")


def load_checkpoint(path, load, args, keys):
    """The checkpoint at ``path`` for ``--resume``, as the dict ``load(raw bytes)`` makes of it, with
    at least ``keys``, "history" and "args" (``vars`` of the options it was written with).

    Fails with one line (exit status 2), never a traceback, when the file is missing or unreadable,
    damaged or truncated (whatever ``load`` raises), or when its options differ from ``args`` in
    one not in ``RESUME_MAY_CHANGE`` (each such option is named, with both values).

    Older checkpoints: every version of the examples has saved ``vars(args)`` in its checkpoints,
    so those written before this check resume as long as their options match. A checkpoint without
    saved options (none that these scripts wrote) is refused with one line, not resumed unchecked;
    so is one whose options are another set (an option added or removed since): that counts as a
    differing option, named with "(no such option)" for the side that lacks it."""
    if path is None or not os.path.isfile(path):
        fail("--resume needs a checkpoint in --out" + ("" if path is None else f": there is no {path}"))
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as error:
        fail(f"cannot read the checkpoint {path} ({error.strerror or one_line(error)})")
    try:
        saved = load(raw)
    except Exception as error:  # unpickling raises nearly anything on bad bytes
        fail(f"checkpoint {path} is damaged or truncated ({one_line(error)}); delete it to start over, or restore a copy")
    if not isinstance(saved, dict) or not {"history", *keys} <= saved.keys():
        fail(f"{path} is not a checkpoint of this example; delete it to start over, or give another --out")
    if not isinstance(saved.get("args"), dict):
        fail(f"checkpoint {path} has no saved options (an older format), so --resume cannot check them; "
             "delete it to start over")
    check_resume_options(path, saved["args"], vars(args))
    return saved


def check_resume_options(path, saved, current):
    """Fail (one line) naming every option outside ``RESUME_MAY_CHANGE`` whose value in the
    checkpoint (``saved``) differs from this run's (``current``); both are ``vars(args)`` dicts."""
    missing = object()

    def show(value):
        if value is missing:
            return "(no such option)"
        return repr(value) if isinstance(value, str) or value is None else str(value)

    names = list(current) + [name for name in saved if name not in current]
    differing = [
        f"--{name.replace('_', '-')}: checkpoint {show(saved.get(name, missing))}, now {show(current.get(name, missing))}"
        for name in names
        if name not in RESUME_MAY_CHANGE and saved.get(name, missing) != current.get(name, missing)
    ]
    if differing:
        fail(f"--resume with options that differ from those of {path}: {'; '.join(differing)}; "
             "give the checkpoint's values, or another --out to start a new run")


def checkpoint_does_not_fit(path, error):
    """Fail (one line): the checkpoint's saved state does not fit the model these options built."""
    fail(f"checkpoint {path} does not fit the model of these options ({one_line(error)}); "
         "delete it to start over, or give another --out")


class StopRequests:
    """Turns SIGINT and SIGTERM into a flag the training loop checks between steps, so that an
    interrupted run saves a checkpoint before it exits."""

    def __init__(self):
        self.signal = None

    def __enter__(self):
        self._previous = {s: signal.signal(s, self._handle) for s in (signal.SIGINT, signal.SIGTERM)}
        return self

    def _handle(self, signum, frame):
        self.signal = signum

    def __exit__(self, *exc):
        for s, handler in self._previous.items():
            signal.signal(s, handler)

    @property
    def requested(self):
        return self.signal is not None


class Progress:
    """A tqdm bar with the running (exponentially averaged) loss; nothing with ``disable``, or when
    the output is not a terminal (a log file would fill with carriage returns)."""

    def __init__(self, total, initial, disable):
        from tqdm import tqdm

        # tqdm's disable=None: off unless stderr is a terminal
        self.bar = tqdm(total=total, initial=initial, disable=True if disable else None, dynamic_ncols=True, unit="step")
        self.running = None

    def update(self, loss):
        self.running = loss if self.running is None else 0.98 * self.running + 0.02 * loss
        self.bar.set_postfix(loss=f"{self.running:.3f}", refresh=False)
        self.bar.update(1)

    def close(self):
        self.bar.close()


# ----------------------------------------------------------------------------- outputs


def write_metrics(out, metrics):
    if out is not None:
        atomic_write(os.path.join(out, "metrics.json"), json.dumps(metrics, indent=2, sort_keys=True).encode())


def plot_learning_curve(out, losses, evaluations=(), ylabel="loss per data point"):
    """losses: one training loss per step; evaluations: (step, value) pairs drawn as points."""
    if out is None or not len(losses):
        return
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    losses = np.asarray(losses, dtype=float)
    window = max(1, len(losses) // 200)
    smooth = np.convolve(losses, np.ones(window) / window, mode="valid")
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(np.arange(len(smooth)) + window, smooth, lw=1, label=f"training (mean of {window} steps)")
    if len(evaluations):
        steps, values = zip(*evaluations)
        ax.plot(steps, values, "o-", ms=3, label="validation, discrete graph")
    ax.set_xlabel("step")
    ax.set_ylabel(ylabel)
    ax.legend()
    fig.tight_layout()
    fig.savefig(os.path.join(out, "learning_curve.png"), dpi=120)
    plt.close(fig)


def save_image_grid(out, filename, rows, image_shape, row_titles):
    """rows: a list of (n, height * width) arrays in [0, 1], drawn one row of images each. Each row is
    one image, its pictures side by side with a white gap (one axes per row: an axes per picture
    cost about a second per figure, most of an example's plotting)."""
    if out is None:
        return
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = max(len(r) for r in rows)
    height, width = image_shape
    gap = max(1, width // 3)
    fig, axes = plt.subplots(len(rows), 1, figsize=(n * 0.8, len(rows) * 0.9), squeeze=False)
    cmap = matplotlib.colormaps["gray"].with_extremes(bad="white")
    for ax, row, title in zip(axes[:, 0], rows, row_titles):
        strip = np.full((height, n * (width + gap) - gap), np.nan)
        for j, picture in enumerate(row):
            strip[:, j * (width + gap):j * (width + gap) + width] = np.asarray(picture).reshape(image_shape)
        ax.imshow(strip, cmap=cmap, vmin=0, vmax=1, interpolation="nearest")
        ax.axis("off")
        ax.set_title(title, fontsize=7, loc="left")
    fig.tight_layout()
    fig.savefig(os.path.join(out, filename), dpi=120)
    plt.close(fig)


def plot_clusters(out, points, clusters, feature_names, filename="clusters.png"):
    """Every pair of the columns of ``points`` (n, d), the points coloured by their cluster."""
    if out is None:
        return
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    points, d = np.asarray(points), np.shape(points)[1]
    fig, axes = plt.subplots(d, d, figsize=(1.8 * d, 1.8 * d), squeeze=False)
    for i in range(d):
        for j in range(d):
            ax = axes[i, j]
            ax.set_xticks([]), ax.set_yticks([])
            if i == j:
                ax.text(0.5, 0.5, feature_names[i], ha="center", va="center", fontsize=8, transform=ax.transAxes)
            else:
                ax.scatter(points[:, j], points[:, i], c=np.asarray(clusters), cmap="tab10", vmin=0, vmax=9, s=4)
    fig.suptitle("MAP clusters", fontsize=9)
    fig.tight_layout()
    fig.savefig(os.path.join(out, filename), dpi=120)
    plt.close(fig)


class Clock:
    """Wall time of the training loop, accumulated over resumed runs, excluding what runs in
    ``paused()`` (evaluation, checkpoints). Wall time, not time inside the step call: with JAX's
    asynchronous dispatch the device keeps computing while Python is elsewhere in the loop."""

    def __init__(self, elapsed=0.0):
        self._elapsed = elapsed
        self._since = time.perf_counter()

    @property
    def elapsed(self):
        return self._elapsed + time.perf_counter() - self._since

    @contextlib.contextmanager
    def paused(self):
        self._elapsed = self.elapsed
        try:
            yield
        finally:
            self._since = time.perf_counter()


def plot_accuracy_vs_active(out, curve, active, test_accuracy, hidden):
    """The L0 examples' accuracy_vs_active_gates.png: test accuracy with the k largest gates kept,
    against k, and the trained net's own point."""
    if out is None:
        return
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    ks, accuracies = zip(*curve)
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(ks, accuracies, lw=1, label="the k largest deterministic gates kept")
    ax.plot([active], [test_accuracy], "o", color="C3", label=f"trained net: {active} of {hidden} gates open")
    ax.set_xlabel("active gates (hidden units kept)")
    ax.set_ylabel("test accuracy")
    ax.set_xscale("log")
    ticks = [t for t in (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000) if t <= hidden]
    ax.set_xticks(ticks, [str(t) for t in ticks])
    ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    ax.set_ylim(0, 1)
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(os.path.join(out, "accuracy_vs_active_gates.png"), dpi=120)
    plt.close(fig)
