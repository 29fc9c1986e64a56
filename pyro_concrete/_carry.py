"""The exact log-space coordinates of a sample, carried alongside the sample: :class:`Carry`.

A Concrete sample ``x = exp(y)`` underflows to exact zeros at low temperature, and a BinConcrete
sample ``x = sigmoid(y)`` to exact 0 or 1; ``y`` itself is finite. ``Concrete.log_prob(x)`` needs
``y``, and it is asked for it by other objects than the one that drew ``x`` (in SVI the model's
prior scores the guide's sample after ``pyro.sample``, ``poutine.trace`` and ``replay``). An
attribute on the tensor (Pyro's ``_unquantize``) is lost by every view, including the
``value.expand(shape)`` by which ``Delta`` hands an autoguide's value to the model; so a registry
keyed by the sample's memory holds them. The distributions call it once per ``rsample`` and once
per ``log_prob``.
"""

import math
import weakref

import torch
from torch.autograd import forward_ad

from ._tracing import quiet_under_trace

__all__ = ["Carry", "carry", "show"]

_INTEGER_OF_SIZE = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}

# Devices whose values the host reads without waiting for anything: the host's own memory. Without
# validation the carry decides its checks there on the host where that saves passes over the sample
# (the same values); on any other device (a GPU) nothing in rsample, log_prob or their gradient reads
# a value back, since each read waits for the device to finish its queue (issue 30).
HOST_DEVICES = ("cpu",)


class _Entry:
    """What :meth:`Carry.attach` recorded of one sample (see :class:`Carry` for its use)."""

    __slots__ = (
        "storage", "data_ptr", "nbytes", "sample", "version", "coordinates", "coordinates_version", "kind",
        "owns_storage", "sentinels", "written",
    )


class Carry:
    """Samples of the family and their log-space coordinates: one entry per storage.

    - **Keyed** by the storage that holds the sample's memory (``x.untyped_storage()``), through a
      weak reference to it: the entry is dropped when that storage is freed, or by :meth:`clear`. An
      entry also records the storage's address and size, the sample's geometry, dtype and device,
      the sample tensor (weakly) and its version counter, and ``y`` with its version counter. A
      lookup is one dictionary access by the value's storage: copies are never looked up (they are
      scored from their values), so no entry is ever scanned or compared with a copy.
    - **Trusted** for a value only if, at that moment: the value lives in the keyed storage, which is
      still at the recorded address with the recorded size (``share_memory_()``, ``set_()``, ``.data =``,
      ``untyped_storage().resize_()`` move or free it); the sample tensor is alive and neither it nor
      ``y`` was modified in place (version counters, which views and ``detach()`` share); the memory
      still holds what the sampler wrote -- edits that bypass the version counter (``x.data.copy_()``,
      writes through ``x.numpy()`` or a DLPack alias) are caught where they touch one of 4 sentinel
      rows (16 elements for the binary kinds) spread from the first to the last, compared on every
      recall at O(1) cost (a comparison of the whole sample costs more than 3 %:
      ``python -m bench.kernels --content-check``); an edit through such an alias that spares every
      sentinel is not seen (README, Numerics); and the value's geometry maps onto the sample's (the
      sample itself, or a view of it whose events are events of the sample: ``detach``, ``expand``,
      batch slices, ``ExpandedDistribution``'s ``permute``/``reshape``). The coordinates returned are
      ``y`` viewed the same way.
    - **Otherwise** nothing is returned, and the value is scored from ``log x`` (exact wherever x did
      not underflow) -- or, for the straight-through distributions, whose discrete values alone do
      not determine the relaxed sample behind them, refused with a ValueError.
    """

    SENTINEL_ROWS = 4
    SENTINEL_ELEMENTS = 16

    def __init__(self):
        self._entries = {}

    def __len__(self):
        return len(self._entries)

    def clear(self):
        """Forget every carried sample (they are scored from their values afterwards)."""
        self._entries.clear()

    def attach(self, value, coordinates, kind):
        """Record that ``value`` has the log-space ``coordinates`` of the given ``kind`` (a
        ``concrete_common.kinds.Kind``; ``LOG``: value = exp(coordinates); ``LOGIT``: value =
        sigmoid(coordinates); ``STRAIGHT_THROUGH_LOG`` / ``_LOGIT``: a straight-through value whose
        relaxed sample is exp / sigmoid of the coordinates; ``LOG_SIMPLEX``, ``REAL``: ``value`` is an
        ExpConcrete (LogitBinConcrete) sample, its own coordinates, all finite, and ``coordinates`` is
        None). Returns value."""
        if _traced():
            return _attach_traced(value, coordinates, kind)
        return self._attach(value, coordinates, kind)

    @quiet_under_trace
    def _attach(self, value, coordinates, kind):
        """:meth:`attach`, eagerly (not traced)."""
        try:
            storage = value.untyped_storage()
            key = storage._cdata
        except (RuntimeError, NotImplementedError, AttributeError):  # no storage (functorch, fake, meta)
            return value
        if coordinates is not None and (coordinates.shape != value.shape or coordinates.stride() != value.stride()):
            coordinates = coordinates.contiguous()
            if not value.is_contiguous():
                return value
        entries = self._entries
        entry = _Entry()
        entry.storage = weakref.ref(storage, lambda ref, key=key: _drop(entries, key, ref))
        entry.data_ptr, entry.nbytes = storage.data_ptr(), storage.nbytes()
        entry.sample, entry.version = weakref.ref(value), _version(value)
        entry.coordinates = coordinates
        entry.coordinates_version = None if coordinates is None else _version(coordinates)
        entry.kind = kind
        entry.owns_storage = (
            value.is_contiguous() and value.storage_offset() == 0 and entry.nbytes == value.numel() * value.element_size()
        )
        sample = value.detach()
        if not entry.owns_storage or value.numel() == 0 or entry.version is None:  # rare (views, inference tensors); compared in full
            entry.sentinels = None
        else:  # rows spread evenly from the first to (about) the last: a strided view, no index tensor
            entry.sentinels = _sentinel_geometry(value, kind, self.SENTINEL_ROWS if kind.n_ary else self.SENTINEL_ELEMENTS)
            sample = sample.as_strided(*entry.sentinels)
        entry.written = sample.clone()  # compared as integers, bit for bit (not viewed so here: torch.jit.trace has no dtype view)
        entries[key] = entry
        return value

    def recall(self, value, kinds):
        """The coordinates carried by ``value`` (a sample of one of the ``kinds``, or a view of one),
        with the autograd graph of the sampler, or None. For transforms and reparametrizers;
        ``log_prob`` uses :meth:`scoring_coordinates`."""
        if _traced():
            return _traced_coordinates(value, kinds, link=False)
        found = self._lookup(value, kinds, validate=True)
        return None if found is None else found[2]

    def scoring_coordinates(self, value, kinds, validate=True):
        """The coordinates with which ``log_prob`` scores ``value``, or None (not an own sample).

        ``validate`` is the distribution's validation. On, the memory check (see the class) is decided
        on the host, and a sample whose memory changed is scored from its value (None). Off, the
        coordinates of a changed sample are NaN, as under a tracer, and nothing waits for a device
        (:data:`HOST_DEVICES` aside): the check runs there.

        Gradients (reverse and forward mode): to the sampler's parameters through the carried
        coordinates if the value is the sample (or a view of it); none through them if it is a
        detached alias; and to the value itself as to a value scored from its own coordinates
        (``dy/dx``, computed stably from y), so that a density can be differentiated with respect to
        its sample. An ExpConcrete / LogitBinConcrete sample is its own coordinates: the value is
        returned."""
        if _traced():
            return _traced_coordinates(value, kinds, link=True)
        found = self._lookup(value, kinds, validate)
        if found is None:
            return None
        entry, sample, y, changed = found
        if entry.coordinates is None:
            return _nan_if(changed, value)
        connected = _connected(value, sample)
        if not connected:
            y = y.detach()
        if not (value.requires_grad and torch.is_grad_enabled()) and _tangent(value) is None:
            # no derivative with respect to the value can be asked for
            return _nan_if(changed, y.detach())
        relaxed = None if entry.kind.straight_through else value
        # the sampler's node, to hand the gradient to; not under torch.jit.trace, whose graph would
        # keep the node of the sample drawn while tracing as a constant
        shown = sample.grad_fn if value is sample and not torch._C._is_tracing() else None
        shown = shown if isinstance(shown, _Show._backward_cls) else None
        if not connected and _recomputed_in_backward(sample):
            shown = _RECOMPUTED
        return _apply_link(value, y, relaxed, entry.kind.binary, shown, changed)

    @quiet_under_trace
    def _lookup(self, value, kinds, validate):
        """(entry, sample, coordinates viewed as the value, changed) for a trusted entry, or None.
        The memory check: under ``validate`` decided on the host (a changed sample is not trusted:
        None); without, ``changed`` is None (unchanged) or True where it is decided on the host
        (:data:`HOST_DEVICES`), else a 0-dim boolean tensor, decided on the device."""
        try:
            storage = value.untyped_storage()
            entry = self._entries.get(storage._cdata)
        except (RuntimeError, NotImplementedError, AttributeError):
            return None
        if entry is None or entry.kind not in kinds or entry.storage() is not storage:
            return None
        sample = entry.sample()
        if (
            sample is None
            or storage.data_ptr() != entry.data_ptr
            or storage.nbytes() != entry.nbytes
            or _version(sample) != entry.version
            or sample.untyped_storage() is not storage
            or value.dtype != sample.dtype
            or (entry.coordinates is not None and _version(entry.coordinates) != entry.coordinates_version)
        ):
            return None
        # an ExpConcrete / LogitBinConcrete sample is its own coordinates
        coordinates = _view(entry, sample, value, sample if entry.coordinates is None else entry.coordinates)
        if coordinates is None:
            return None
        changed = None
        if torch._C._is_tracing():  # a traced graph has no way to edit memory between its operations
            pass
        elif validate or sample.device.type in HOST_DEVICES:
            if not _unchanged(entry, sample):
                if validate:
                    return None
                changed = True
        else:
            changed = _changed(entry, sample)
        return entry, sample, value if entry.coordinates is None else coordinates, changed


carry = Carry()  # the registry of this process, which every distribution of the package uses


def show(y, kind):
    """The sample ``x = exp(y)`` (``kind`` LOG) or ``sigmoid(y)`` (LOGIT), attached with its coordinates ``y``."""
    if _traced():
        return carry.attach(torch.sigmoid(y) if kind.binary else torch.exp(y), y, kind)
    return carry._attach(_apply_show(y, kind.binary), y, kind)


# ----------------------------------------------------------------------------- traced: torch.compile, torch.func
# Dynamo cannot key a registry by memory (it guards on the dictionary, and recompiles as it grows),
# and functorch's wrapped tensors have no storage. There the coordinates ride on the sample object
# itself, an attribute both follow; views and copies of it are scored from their values, and a
# sample whose content changed after it was drawn (compared in full, in the graph) scores NaN: a
# traced function cannot raise on data.

_ATTRIBUTE = "_concrete_coordinates"


def _traced():
    """Whether this runs under torch.compile's tracer, inside a torch.func transform or under
    ``make_fx`` (the tracer of AOTAutograd and torch.export, and of a whole Pyro loss)."""
    return (
        torch.compiler.is_compiling()
        or torch._C._functorch.peek_interpreter_stack() is not None
        or torch._C._get_dispatch_mode(torch._C._TorchDispatchModeKey.PROXY) is not None
    )


def _attach_traced(value, coordinates, kind):
    setattr(value, _ATTRIBUTE, (coordinates, kind, value.detach().clone()))
    return value


def _traced_coordinates(value, kinds, link):
    """The coordinates attached to the object ``value`` (NaN where its content changed since), or
    None; an ExpConcrete / LogitBinConcrete sample is scored from its value (its own coordinates)."""
    attached = getattr(value, _ATTRIBUTE, None)
    if attached is None or attached[1] not in kinds or attached[0] is None:
        return None
    y, kind, drawn = attached
    same = value.detach() == drawn
    if kind.n_ary:
        same = same.all(-1, keepdim=True)
    y = torch.where(same, y, torch.nan)
    if not link:
        return y
    # Dynamo does not trace an autograd.Function with a jvp; functorch's forward mode needs one
    link_class = _CompiledLink if torch.compiler.is_compiling() else _TracedLink
    return link_class.apply(value, y, kind.binary)


class _CompiledLink(torch.autograd.Function):
    """:class:`_Link` without the hand-over to the sampler's node: the coordinates y forward; g
    split between the value (``g dy/dx`` where within the bound) and y (the rest) backward."""

    generate_vmap_rule = True

    @staticmethod
    def forward(value, y, logit):
        return y.view_as(y)

    @staticmethod
    def setup_context(ctx, inputs, output):
        _, y, ctx.logit = inputs
        ctx.save_for_backward(y)
        ctx.save_for_forward(y)
        ctx.set_materialize_grads(False)

    @staticmethod
    def backward(ctx, g):
        if g is None:
            return None, None, None
        (y,) = ctx.saved_tensors
        slope = _traced_slope(y, ctx.logit)
        gx = _within_bound(g / slope)
        return gx, g - gx * slope, None


class _TracedLink(_CompiledLink):
    """:class:`_CompiledLink` with forward mode, for torch.func's ``jvp`` and ``jacfwd``."""

    @staticmethod
    def jvp(ctx, value_dot, y_dot, *_):
        if y_dot is not None:
            return y_dot.view_as(y_dot)
        if value_dot is None:
            return None
        (y,) = ctx.saved_tensors
        return _within_bound(value_dot / _traced_slope(y, ctx.logit))


def _traced_slope(y, logit):
    """dx/dy of the relaxed sample x = exp(y) (sigmoid(y)), from y."""
    return _slope_of(torch.sigmoid(y) if logit else torch.exp(y), logit)


def _within_bound(quotient):
    """``quotient`` where it is within ±_bound, else 0 (also at NaN): decided on the device."""
    return torch.where(quotient.abs() <= _bound(quotient), quotient, 0.0)


def _drop(entries, key, ref):
    entry = entries.get(key)
    if entry is not None and entry.storage is ref:
        del entries[key]


def _sentinel_geometry(sample, kind, count):
    """(size, stride) of the sentinel rows of a contiguous sample that owns its storage: ``count``
    rows (elements, for the binary kinds) spread evenly from the first to (about) the last."""
    width = sample.shape[-1] if kind.n_ary else 1
    rows = sample.numel() // width
    step = max(1, (rows - 1) // (count - 1))
    taken = min(count, -(-rows // step))
    return ((taken, width), (step * width, 1)) if kind.n_ary else ((taken,), (step,))


def _version(tensor):
    """``tensor``'s version counter, or None for an inference tensor (made under
    ``torch.inference_mode``), which has none: such a sample's memory is compared in full instead."""
    return None if tensor.is_inference() else tensor._version


def _written(entry, sample):
    """(what the sample's memory holds now, what the sampler wrote there): in full for a sample that
    is a view (rare), else the sentinel rows (see :class:`Carry`); as integers, so that the
    comparison is of bits."""
    now = sample.detach()
    if entry.sentinels is not None:
        now = now.as_strided(*entry.sentinels)
    integer = _INTEGER_OF_SIZE[now.element_size()]
    return now.view(integer), entry.written.view(integer)


def _unchanged(entry, sample):
    """Whether the sample's memory still holds what the sampler wrote, decided on the host."""
    return torch.equal(*_written(entry, sample))


def _nan_if(changed, y):
    """y, or NaN in its shape where ``changed`` (True, or a 0-dim boolean tensor: one masked_fill)."""
    if changed is None:
        return y
    return torch.full_like(y, math.nan) if changed is True else y.masked_fill(changed, math.nan)


def _changed(entry, sample):
    """Not :func:`_unchanged`, decided on the device with nothing waiting for it: a 0-dim boolean
    tensor (the coordinates are then filled with NaN where it is True: one ``masked_fill``)."""
    now, then = _written(entry, sample)
    return torch.ne(now, then).any()


def _view(entry, sample, value, coordinates):
    """``coordinates`` (shaped like the sample) viewed as ``value`` views the sample, or None when
    the value's events are not events of the sample."""
    offset = value.storage_offset() - sample.storage_offset()
    if value.shape == sample.shape and value.stride() == sample.stride() and offset == 0:
        return coordinates
    if not entry.owns_storage:
        return None
    if entry.kind.n_ary:  # every row of the value must be a row of the sample
        num_categories = sample.shape[-1]
        if value.dim() == 0 or value.shape[-1] != num_categories or (value.stride(-1) != 1 and num_categories > 1):
            return None
        batch = [s for s, n in zip(value.stride()[:-1], value.shape[:-1]) if n > 1]
        if offset % num_categories or any(s % num_categories for s in batch):
            return None
    return coordinates.as_strided(value.shape, value.stride(), coordinates.storage_offset() + offset)


# The link's mark for a detached alias of a sample scored inside a backward pass: what reentrant
# ``torch.utils.checkpoint`` does, recomputing its function on detached aliases of its inputs and
# returning their gradients to the outer pass, which carries them on through the sample to the
# sampler's parameters. The part of the gradient that the sample's value cannot carry (where it
# underflowed to 0 or 1) would be lost there, a wrong finite gradient: the link refuses it instead.
_RECOMPUTED = object()


def _recomputed_in_backward(sample):
    """Whether a detached alias of ``sample`` is being scored inside a backward pass while the sample
    still leads to its sampler's parameters (see :data:`_RECOMPUTED`)."""
    return isinstance(sample.grad_fn, _Show._backward_cls) and torch._C._current_graph_task_id() != -1


def _refuse_a_lost_gradient(g, gx):
    """Under :data:`_RECOMPUTED`: raise where part of ``g`` would be lost (``g`` nonzero where the
    value carries none of it, ``gx`` 0: the sample underflowed there)."""
    if bool(((gx == 0) & (g != 0)).any()):
        raise RuntimeError(
            "log_prob of a detached alias of a pyro_concrete sample was differentiated inside a backward pass "
            "(reentrant torch.utils.checkpoint recomputes its function on detached inputs), and the sample underflowed "
            "to 0 or 1 where the gradient with respect to the sampler's parameters cannot pass through its value: it "
            "would be lost. Use torch.utils.checkpoint(..., use_reentrant=False), or score the sample outside the "
            "checkpointed function."
        )


def _tangent(value):
    """The forward-mode tangent of ``value`` (``torch.autograd.forward_ad``), or None."""
    return forward_ad.unpack_dual(value).tangent


def _connected(value, sample):
    """Whether gradients reaching ``value`` flow on to the sample's graph (the sample itself or a
    view of it; not a detached alias such as ``x.detach().requires_grad_()``)."""
    return value is sample or (value._is_view() and value._base is (sample._base if sample._is_view() else sample))


class _Link(torch.autograd.Function):
    """The coordinates y in the forward pass (NaN if ``changed``, where the memory check was left to
    the device). In the backward pass the gradient g with respect to y
    is split: the part the value x can carry, ``g dy/dx`` where that is finite, goes to x, and the
    rest to y, so that ``torch.autograd.grad(log_prob, x)`` reaches the sample while the sampler's
    parameters still receive exactly g through y (through x and its exp/sigmoid, plus the rest),
    also where x underflowed to 0 or 1 and dy/dx is infinite. Where the value is the sample itself,
    g is handed to the sampler's :class:`_Show` node instead (which then needs no pass through x
    when nothing else reached it). Under ``create_graph`` the split is differentiable
    (dy/dx is computed from x itself) and goes to y directly. In forward mode the tangent is y's own
    where the value is the sample, else the value's times dy/dx. Nothing here waits for the device."""

    @staticmethod
    def forward(ctx, value, y, relaxed, logit, shown, changed):
        ctx.logit, ctx.shown = logit, shown
        ctx.save_for_backward(y, relaxed)
        ctx.save_for_forward(y, relaxed)
        ctx.set_materialize_grads(False)  # jvp: an input without a tangent gets None, not zeros
        return y.view_as(y) if changed is None else _nan_if(changed, y)

    @staticmethod
    def backward(ctx, g):
        if g is None:
            return None, None, None, None, None, None
        slope = _slope(ctx)
        gx = _carried_part(g, slope)
        if ctx.shown is _RECOMPUTED:
            _refuse_a_lost_gradient(g, gx)
            return gx, None, None, None, None, None
        if ctx.shown is not None and not torch.is_grad_enabled() and torch._C._will_engine_execute_node(ctx.shown):
            _offer(ctx.shown, gx, g)  # the sampler's _Show gives y the rest, if it needs to
            return gx, None, None, None, None, None
        # where x underflowed (slope 0) or dy/dx is astronomically large, x carries nothing and the
        # rest of g goes to y
        return gx, torch.addcmul(g, gx, slope, value=-1), None, None, None, None

    @staticmethod
    def jvp(ctx, value_dot, y_dot, *_):
        if y_dot is not None:  # the value is the sample (or a view): its coordinates carry its tangent
            return y_dot.view_as(y_dot)
        return None if value_dot is None else _carried_part(value_dot, _slope(ctx))


def _carried_part(numerator, slope):
    """numerator / slope where that is within ±_bound, else 0 (also at NaN). The bound keeps the
    gradients of several densities scoring the same sample from overflowing when autograd adds them
    at x. On a GPU decided on the device (two passes more); where the host is the device
    (:data:`HOST_DEVICES`), one reduction read on the host skips them when nothing is beyond it, the
    common case (the same values either way).

    Differentiated again (``create_graph``), the quotient's derivative with respect to the slope is
    ``-(numerator / slope) / slope``: it must be within the bound as well, or the second derivatives
    with respect to the parameters, where the paths through x and y cancel exactly, would be inf - inf
    = NaN; entries beyond it go to y directly, as do the masked entries, which divide by 1 so that
    their derivatives are 0."""
    if not torch.is_grad_enabled():
        quotient = numerator / slope
        if quotient.device.type in HOST_DEVICES and quotient.numel():
            low, high = torch.aminmax(quotient)
            bound = _bound(quotient)
            if -bound <= float(low) and float(high) <= bound:
                return quotient
        return _within_bound(quotient)
    bound = _bound(numerator)
    quotient = numerator.detach() / slope.detach()
    keep = (quotient.abs() <= bound) & ((quotient / slope.detach()).abs() <= bound)  # False at NaN
    return torch.where(keep, numerator / torch.where(keep, slope, 1.0), 0.0)


def _slope_of(x, logit):
    """dx/dy at the relaxed sample x, as the backward of exp (grad * result) and sigmoid (grad * (1 -
    result) * result) computes it; sigmoid_backward(1, x) is (1 - x) x in one pass."""
    if logit:
        return torch.ops.aten.sigmoid_backward(x.new_ones(()).expand_as(x), x)
    return x


def _slope(ctx):
    """dx/dy at the link's value."""
    y, relaxed = ctx.saved_tensors
    if relaxed is None:  # a straight-through value: the relaxed sample is not in its memory
        relaxed = torch.sigmoid(y) if ctx.logit else torch.exp(y)
    return _slope_of(relaxed, ctx.logit)


class _Show(torch.autograd.Function):
    """``x = exp(y)`` (``sigmoid(y)``), the sample, with torch's gradient ``grad * dx/dy``, and the
    receiver of the gradients of the links scoring it (:func:`_offer`): a link that scores the
    sample itself sends x ``gx = g dy/dx`` where that is finite, and hands its ``g`` to this node
    rather than returning to y the rest of g that x does not carry (where x underflowed).
    If the only gradient reaching x is one link's ``gx``, unchanged, the gradient with respect to y
    is that link's ``g``, exact and already in memory: ``d.log_prob(d.rsample())`` costs no pass
    through x. Otherwise ``grad * dx/dy`` plus each link's rest, ``g - gx * dx/dy``. The rest reaches
    y only through this node; that loses nothing, since y's gradient is wanted exactly when this
    node runs: its one input is y. (A ``forward(ctx, ...)`` Function: one with ``setup_context``
    costs an ``inspect.signature`` per call; under torch.func the sample is shown without it.)"""

    @staticmethod
    def forward(ctx, y, logit):
        x = torch.sigmoid(y) if logit else torch.exp(y)
        ctx.logit = logit
        ctx.offers = {}  # backward pass -> what the links handed over in it
        ctx.save_for_backward(x)
        ctx.save_for_forward(x)
        return x

    @staticmethod
    def backward(ctx, grad):
        offers = ctx.offers.pop(torch._C._current_graph_task_id(), [])
        for _, _, g, g_version in offers:
            if g._version != g_version:
                raise RuntimeError("a gradient handed over by log_prob was modified in place during the backward pass")
        if len(offers) == 1 and grad is offers[0][0] and grad._version == offers[0][1]:
            return offers[0][2], None
        (x,) = ctx.saved_tensors
        grad_y = torch.ops.aten.sigmoid_backward(grad, x) if ctx.logit else grad * x
        if offers:  # each link's rest, from its g: a hook on x may have edited its gx in place
            slope = _slope_of(x, ctx.logit)
            for _, _, g, _ in offers:
                grad_y = grad_y + torch.addcmul(g, _carried_part(g, slope), slope, value=-1)
        return grad_y, None

    @staticmethod
    def jvp(ctx, y_dot, _):
        (x,) = ctx.saved_tensors
        return y_dot * x * (1 - x) if ctx.logit else y_dot * x


# the two Functions' C ``apply``, without ``Function.apply``'s Python wrapper, whose work (binding
# arguments for ``setup_context``, unwrapping dead torch.func wrappers) has nothing to do on the
# eager path: a value there has a storage, so no torch.func wrapper reaches them
_apply_show = super(torch.autograd.Function, _Show).apply
_apply_link = super(torch.autograd.Function, _Link).apply


def _offer(shown, gx, g):
    """Hand the sample's :class:`_Show` node a link's ``gx = g dy/dx`` and its ``g``, with their
    version counters, for this backward pass (keyed by it: nested or concurrent passes over the same
    graph keep their own), if the engine will reach the node in this pass (the link asks). The node
    takes them when it runs. It does not run in a pass that only captures the sample's gradient
    (``torch.autograd.grad(..., inputs=[x])``): such a pass's offers stay behind, so a pass that finds
    another's drops its own when it ends (a callback at its end, which costs more than the rest of
    the link's backward, so only then): at most one pass's offers stay, until the graph is freed."""
    task, offers = torch._C._current_graph_task_id(), shown.offers
    if offers and task not in offers:
        torch.autograd.Variable._execution_engine.queue_callback(lambda: offers.pop(task, None))
    offers.setdefault(task, []).append((gx, gx._version, g, g._version))


def _bound(t):
    bound = _BOUNDS.get(t.dtype)
    if bound is None:
        bound = _BOUNDS[t.dtype] = torch.finfo(t.dtype).max / 1024
    return bound


_BOUNDS: dict[torch.dtype, float] = {}  # per dtype, rather than a torch.finfo per backward step
