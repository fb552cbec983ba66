"""Ways to stream a weight matrix for one row of activations, and the per-device choice among them (chapter 02).

A batch-1 decode step is a chain of matrix-vector products, so its speed is the speed at which one of these kernels
reads the weights. Plain PyTorch has several, and which one streams fastest depends on the machine (a bf16
`torch.mv` beats `F.linear` on one CPU and loses on another; a compiled multiply-and-sum wins on a third). The book
never picks for one machine: `measure_matvec` times every path on the reader's device, once, over the same bytes as
the bandwidth test, and the decoder (`book.llama.linear`) uses the fastest. The best of them is the device's
*matrix-vector ceiling*, the most a decode step in plain PyTorch can hope to stream. Each path also has a fixed cost
per call (Python and operator dispatch, a kernel launch on a GPU, and a compiled function's guard checks, which on
some CPUs take longer than reading a small model's layer), so each is described by a fixed cost and a streaming rate, and a weight takes the path that is
quickest *for its size* (`matvec_costs`, `set_matvec_costs`). A few rows at once (a batched step, a verification
pass) get the same treatment: `measure_rows` times F.linear against the product with the weight on the left, which
on some CPUs streams several times faster. And on some CPUs a one-row product over rows longer than about 4096
elements streams at about half the rate of shorter rows, whichever path runs it (the Zen 4 build: a [4096, 11008]
bf16 weight at 20 GB/s, a [11008, 4096] one at 33): `measure_blocks` times such a weight stored as blocks of its
columns, each a contiguous [N, c] matrix with c <= 4096, and where that is faster the decoder stores its long-row
weights so (`row_blocks`, `to_blocks`, `blocked_linear`).
"""
from __future__ import annotations

import os
import sys
from typing import Callable

import torch
import torch.nn.functional as F

from .device import as_device
from .timing import time_fn

__all__ = ["PATHS", "matvec", "measure_matvec", "matvec_path", "set_matvec_path", "mulsum", "MatvecResult",
           "describe", "ROW_PATHS", "FEW_ROWS", "few_rows", "measure_rows", "rows_path", "set_rows_path",
           "measure_call_cost", "set_matvec_costs", "cheapest", "call_time", "SMALL_ROWS", "SMALL_K", "weight_stack",
           "BLOCK_MAX", "LONG_ROWS", "block_width", "to_blocks", "from_blocks", "blocked_linear", "measure_blocks",
           "row_blocks", "set_row_blocks", "BLOCKS_PAY", "blocks_pay"]

#: The matrix-vector paths, with the one-line description the benchmark prints.
PATHS: dict[str, str] = {
    "linear": "F.linear (the matrix-matrix kernel with one row)",
    "mv": "torch.mv (PyTorch's matrix-vector kernel)",
    "mulsum": "torch.compile((w * x).sum(-1)) (a generated multiply-and-sum loop)",
}

_CHOICE: dict[tuple[str, torch.dtype], str] = {}          # (device type, dtype) -> path; filled by measurement
#: (device type, dtype) -> {path: (fixed seconds a call, bytes/s streamed)}; filled by measurement
_COSTS: dict[tuple[str, torch.dtype], dict[str, tuple[float, float]]] = {}
_SIZED: dict[tuple[str, torch.dtype, int], str] = {}      # cheapest() per weight size, kept off the decode step
_COMPILED: list[Callable] = []                           # the compiled multiply-and-sum, made on first use


def _mulsum_eager(w: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    return (w * x).sum(-1)


def mulsum(w: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """w @ x as a compiled elementwise multiply and row sum (chapter 02). One compiled function serves every shape:
    its sizes are symbolic from the start (dynamic=True), so each dtype compiles once for rows up to 4096 elements
    and once for longer rows, instead of once more per shape it met first (the ceilings' three precisions, met at
    one large matrix first, reached torch._dynamo's recompile limit of 8 and fell back to the eager product, 2.8
    GB/s over rows of 11008 on a Zen 4). Symbolic sizes streamed as fast as static ones there."""
    if not _COMPILED:
        _COMPILED.append(torch.compile(_mulsum_eager, dynamic=True))
    # detach: torch.compile keeps an nn.Parameter's sizes static, so a model's weights (a few shapes, each dtype)
    # would each compile anew, and past torch._dynamo's recompile limit run the eager product, which materialises
    # w * x, a temporary as large as the weight. A plain tensor gets symbolic sizes like any input. The vector too:
    # a view (a row of the decoder's activations) is guarded on its base's sizes and strides, which differ between
    # callers; and the product always runs without autograd, whose on/off state is guarded too (each cost a graph).
    with torch.no_grad():
        return _COMPILED[0](w.detach(), x.detach())


def _read_env() -> str | None:
    p = os.environ.get("BOOK_MATVEC", "").strip()
    if p and p not in PATHS:
        raise ValueError(f"BOOK_MATVEC={p!r} is not a matrix-vector path; use one of {', '.join(PATHS)}")
    return p or None


_ENV = _read_env()   # read once: the decode step may be traced by torch.compile


def _env_path() -> str | None:
    return _ENV


def call_time(cost: tuple[float, float], nbytes: float) -> float:
    """Predicted seconds of one call on a weight of `nbytes`, from a path's (fixed seconds a call, bytes/s it
    streams beyond that; `Ceilings.matvec_costs`): fixed cost + nbytes / rate (chapter 02)."""
    return cost[0] + nbytes / cost[1]


def cheapest(costs: dict[str, tuple[float, float]], nbytes: float) -> str:
    """The path with the least predicted time (`call_time`) for a weight of `nbytes` (chapter 02)."""
    return min(costs, key=lambda p: call_time(costs[p], nbytes))


def matvec_path(device: torch.device | str, dtype: torch.dtype, nbytes: int | None = None) -> str:
    """The path the decoder uses for one row on this device and dtype: $BOOK_MATVEC; else, for a weight of `nbytes`
    where each path's cost was measured, the quickest for that size; else the choice measured on 4096-row layers;
    else 'linear' (nothing measured yet) (chapter 02)."""
    env = _env_path()
    if env:
        return env
    kind = device.type if isinstance(device, torch.device) else torch.device(device).type
    costs = _COSTS.get((kind, dtype))
    if costs and nbytes is not None:       # called for every weight of every step: the choice is kept per size
        path = _SIZED.get((kind, dtype, nbytes))
        if path is None:
            path = cheapest(costs, nbytes)
            if not torch.compiler.is_compiling():
                _SIZED[(kind, dtype, nbytes)] = path
        return path
    return _CHOICE.get((kind, dtype), "linear")


def set_matvec_costs(device: torch.device | str, dtype: torch.dtype,
                     costs: dict[str, tuple[float, float]] | None) -> None:
    """Record each path's (fixed seconds a call, bytes/s) on this device and dtype, so a weight takes the path that
    is quickest for its size (done with the ceilings); None forgets them (chapter 02)."""
    key = (torch.device(device).type, dtype)
    _SIZED.clear()
    if not costs:
        _COSTS.pop(key, None)
        return
    for path, (fixed, rate) in costs.items():
        if path not in PATHS:
            raise ValueError(f"unknown matrix-vector path {path!r}; use one of {', '.join(PATHS)}")
        if not fixed >= 0 or not rate > 0:
            raise ValueError(f"path {path}: need a fixed cost >= 0 s and a rate > 0 bytes/s, got {fixed}, {rate}")
    _COSTS[key] = dict(costs)


def set_matvec_path(device: torch.device | str, dtype: torch.dtype, path: str) -> None:
    """Record the path to use for one row on this device and dtype (done by `measure_matvec`); it replaces any
    per-size costs recorded before (chapter 02)."""
    if path not in PATHS:
        raise ValueError(f"unknown matrix-vector path {path!r}; use one of {', '.join(PATHS)}")
    _CHOICE[(torch.device(device).type, dtype)] = path
    _COSTS.pop((torch.device(device).type, dtype), None)
    _SIZED.clear()


def matvec(w: torch.Tensor, x: torch.Tensor, path: str) -> torch.Tensor:
    """w [N,K] @ x [K] -> [N] by the named path (chapter 02)."""
    if path == "mv":
        return torch.mv(w, x)
    if path == "mulsum":   # inside a compiled decode step the expression itself is compiled with the rest
        if torch.compiler.is_compiling():
            return _mulsum_eager(w, x)
        try:
            return mulsum(w, x)
        except Exception as e:   # noqa: BLE001 - a compiled path that fails later falls back, with a line
            key = (w.device.type, w.dtype)
            if _CHOICE.get(key) == "mulsum":
                _CHOICE[key] = "linear"
            rest = {p: c for p, c in _COSTS.pop(key, {}).items() if p != "mulsum"}
            if rest:
                _COSTS[key] = rest
            _SIZED.clear()
            print(f"note: the compiled matrix-vector product failed for shape {tuple(w.shape)} "
                  f"({type(e).__name__}); using F.linear from now on", file=sys.stderr)
            return F.linear(x[None], w)[0]
    if path == "linear":
        return F.linear(x[None], w)[0]
    raise ValueError(f"unknown matrix-vector path {path!r}; use one of {', '.join(PATHS)}")


#: Ways to multiply a few rows of activations (a batched decode step, a verification pass) by a weight [N, K]. On
#: some CPUs the row-major product with 2-32 rows streams the weight several times slower than with one row, while
#: the same product with the weight as the left operand (many rows, few columns) does not.
ROW_PATHS: dict[str, str] = {
    "linear": "F.linear (x @ w.T)",
    "wx": "(w @ x.T).T (the weight as the left operand)",
}
FEW_ROWS = 32                                             # rows up to this many use the measured choice
_ROWS_CHOICE: dict[tuple[str, torch.dtype], str] = {}     # (device type, dtype) -> path; filled by measurement


def rows_path(device: torch.device | str, dtype: torch.dtype) -> str:
    """The path the decoder uses for 2..FEW_ROWS rows on this device and dtype: the measured choice, else 'linear'
    (chapter 02)."""
    return _ROWS_CHOICE.get((torch.device(device).type, dtype), "linear")


def set_rows_path(device: torch.device | str, dtype: torch.dtype, path: str) -> None:
    """Record the path to use for a few rows on this device and dtype (done by `measure_rows`) (chapter 02)."""
    if path not in ROW_PATHS:
        raise ValueError(f"unknown few-rows path {path!r}; use one of {', '.join(ROW_PATHS)}")
    _ROWS_CHOICE[(torch.device(device).type, dtype)] = path


# The row counts a few-rows rate is measured over (a batched step, a verification pass), chapter 02.
ROWS_SAMPLED = (4, 16)


def few_rows(w: torch.Tensor, x: torch.Tensor, path: str) -> torch.Tensor:
    """x [R, K] @ w [N, K].T -> [R, N] (contiguous) by the named path (chapter 02)."""
    if path == "wx":
        return (w @ x.T).T.contiguous()
    if path == "linear":
        return F.linear(x, w)
    raise ValueError(f"unknown few-rows path {path!r}; use one of {', '.join(ROW_PATHS)}")


def weight_stack(nbytes: int, n: int, k: int, device: torch.device, dtype: torch.dtype) -> list[torch.Tensor]:
    """Random [n, k] weights, as many as fit in about `nbytes` (at least one), for streaming through one after
    another as a decode step reads its layers (chapter 02)."""
    from .hardware import random_tensor
    size = n * k * torch.empty((), dtype=dtype).element_size()
    return [random_tensor(n, k, device=device, dtype=dtype) for _ in range(max(1, nbytes // size))]


def measure_rows(device: torch.device | str | None = None, dtype: torch.dtype = torch.bfloat16, *,
                 nbytes: int = 256 * 2**20, k: int = 4096, n: int = 4096, rows: tuple[int, ...] = (4, 16),
                 repeats: int = 5, choose: bool = True) -> dict[str, float]:
    """Bytes of weight per second each few-rows path streams: `rows` rows through about `nbytes` of [n, k] layers
    read in turn, as a batched decode step reads them (the time summed over the row counts); `choose=True` makes the
    fastest the decoder's path for this device and dtype (chapter 02)."""
    dev = as_device(device)
    if nbytes <= 0 or k < 1 or n < 1 or not rows or min(rows) < 1:
        raise ValueError(f"need nbytes > 0, k, n >= 1 and rows >= 1; got {nbytes}, {k}, {n}, {rows}")
    ws = weight_stack(nbytes, n, k, dev, dtype)
    size = ws[0].nbytes
    xs = [torch.randn(r, k, device=dev).to(dtype) for r in rows]
    want = [F.linear(x, ws[0]).float() for x in xs]
    rates = {}
    for path in ROW_PATHS:
        for x, ref in zip(xs, want):
            err = (few_rows(ws[0], x, path).float() - ref).abs().max() / ref.abs().max().clamp_min(1e-30)
            if not err < 2e-2:
                raise RuntimeError(f"few-rows path {path} gave a wrong result (relative error {float(err):.1e})")
        t = time_fn(lambda: [few_rows(w, x, path) for x in xs for w in ws], device=dev, warmup=1,
                    repeats=repeats, number=None)
        rates[path] = len(xs) * len(ws) * size / t.median
    if choose:
        set_rows_path(dev, dtype, max(rates, key=rates.get))
    return rates


class MatvecResult(dict):
    """Bytes per second of each path that ran (a dict), plus `failed` {path: reason} and the `best` path."""

    def __init__(self, rates: dict[str, float], failed: dict[str, str]):
        super().__init__(rates)
        self.failed = failed

    @property
    def best(self) -> str:
        """The fastest path that ran (chapter 02)."""
        return max(self, key=self.get)


def measure_matvec(nbytes: int, device: torch.device | str | None = None, dtype: torch.dtype = torch.bfloat16, *,
                   repeats: int = 7, paths: tuple[str, ...] = tuple(PATHS), choose: bool = True,
                   k: int = 4096, rows: int | None = None) -> MatvecResult:
    """Stream about `nbytes` of random [N, k] weights through each path once per repeat and return bytes/s per
    path (chapter 02). `rows=None`: one matrix of all the bytes (the matrix-vector *ceiling*); `rows=4096`: matrices
    of [rows, k] one after another, as a decoder's layers are read, each call paying its own per-call cost (the
    decoder's *choice*: on a GPU a generated kernel can win on one huge matrix and lose on a layer's). A path that
    fails here (e.g. torch.compile without a C++ compiler) is left out with its reason, and `choose=True` makes the
    fastest the decoder's path for this device and dtype."""
    dev = as_device(device)
    if nbytes <= 0:
        raise ValueError(f"matrix size must be positive, got {nbytes} bytes")
    if rows is not None and rows < 1:
        raise ValueError(f"rows per matrix must be at least 1, got {rows}")
    per_row = k * torch.empty((), dtype=dtype).element_size()
    n_total = max(1, nbytes // per_row)
    n = n_total if rows is None else min(rows, n_total)
    ws = weight_stack(nbytes, n, k, dev, dtype)
    x = torch.randn(k, device=dev).to(dtype)
    size = sum(w.numel() * w.element_size() for w in ws)
    rates, failed = {}, {}
    want = matvec(ws[0], x, "linear").float()
    for path in paths:
        try:
            one = (lambda w: mulsum(w, x)) if path == "mulsum" else (lambda w, p=path: matvec(w, x, p))
            got = one(ws[0])    # also compiles, outside the timing; a failure here leaves the path out
            err = (got.float() - want).abs().max() / want.abs().max().clamp_min(1e-30)
            if not err < 2e-2:
                raise RuntimeError(f"wrong result (relative error {float(err):.1e})")
            t = time_fn(lambda: [one(w) for w in ws], device=dev, warmup=1, repeats=repeats, number=None)
            rates[path] = size / t.median
        except Exception as e:   # noqa: BLE001 - any failure means "not available on this device"
            failed[path] = f"{type(e).__name__}: {str(e).splitlines()[0][:120] if str(e) else ''}"
            if path == "mulsum":
                print(f"note: torch.compile is not usable here ({failed[path]}); the matrix-vector choice "
                      f"leaves out the compiled path", file=sys.stderr)
    if not rates:
        raise RuntimeError(f"no matrix-vector path ran on {dev}: {failed}")
    result = MatvecResult(rates, failed)
    if choose:
        set_matvec_path(dev, dtype, result.best)
    return result


#: The weight the fixed cost a call is measured on: [SMALL_ROWS, SMALL_K], small enough to stay in cache.
SMALL_ROWS, SMALL_K = 64, 256


def measure_call_cost(paths: tuple[str, ...] = tuple(PATHS), device: torch.device | str | None = None,
                      dtype: torch.dtype = torch.bfloat16, *, repeats: int = 7) -> dict[str, float]:
    """Each path's fixed cost a call, in seconds (chapter 02): the time a call takes on one small
    [SMALL_ROWS, SMALL_K] weight that stays in cache, whose bytes are read in well under a microsecond, so what is
    left is the cost of calling the path (Python and operator dispatch, a kernel launch on a GPU, a compiled
    function's guard checks). A path that fails here is left out (`measure_matvec` reports why)."""
    dev = as_device(device)
    w = torch.randn(SMALL_ROWS, SMALL_K, device=dev).to(dtype)
    x = torch.randn(SMALL_K, device=dev).to(dtype)
    fixed = {}
    for path in paths:
        one = (lambda: mulsum(w, x)) if path == "mulsum" else (lambda p=path: matvec(w, x, p))
        try:
            fixed[path] = time_fn(one, device=dev, warmup=3, repeats=repeats, number=None, min_repeat_s=5e-3).median
        except Exception:   # noqa: BLE001 - not available on this device
            continue
    return fixed


def describe(device: torch.device | str, dtype: torch.dtype, rates: dict[str, float] | None = None) -> str:
    """One line: which path the decoder uses for one row of a layer-sized weight here, and why; and, where the
    fixed costs a call were measured, which path small weights take (chapter 02)."""
    layer = 4096 * 4096 * torch.empty((), dtype=dtype).element_size()
    path = matvec_path(device, dtype, layer)
    if _env_path():
        return f"{PATHS[path]}: set by $BOOK_MATVEC"
    if not rates:
        return f"{PATHS[path]}: nothing measured yet on this device (the plain default)"
    others = ", ".join(f"{p} {r / 1e9:.1f}" for p, r in sorted(rates.items(), key=lambda kv: -kv[1]))
    line = f"{PATHS[path]}: the fastest here over 4096-row layers, measured (GB/s when the paths were compared: {others})"
    costs = _COSTS.get((torch.device(device).type, dtype))
    if costs and len(costs) > 1:
        fixed = ", ".join(f"{p} {c[0] * 1e6:.0f}" for p, c in costs.items())
        small = cheapest(costs, 2**20)
        line += (f"; fixed cost a call (us: {fixed}), so weights of 1 MiB take {small}" if small != path else
                 f"; fixed cost a call (us: {fixed})")
    return line


# ------------------------------------------------------------------------------------------------ long rows

#: Rows longer than this many elements may be stored as blocks of at most this many columns.
BLOCK_MAX = 4096
#: The weight the choice is measured on: Llama-2-7B's MLP down projection, [hidden, intermediate].
LONG_ROWS = (4096, 11008)
#: Blocks replace whole rows only where they stream at least this many times as fast (a margin over run-to-run noise).
BLOCKS_PAY = 1.15
_BLOCKS: dict[tuple[str, torch.dtype], bool] = {}          # (device type, dtype) -> blocks measured faster
_BLOCKED: list[Callable] = []                             # the compiled blocked product, made on first use


def block_width(k: int) -> int | None:
    """Columns per block for rows of `k` elements: the widest multiple of 64 up to BLOCK_MAX that divides k (2752
    for 11008, 3584 for 14336); None where k needs no blocks (k <= BLOCK_MAX) or has no such divisor (chapter 02)."""
    if k <= BLOCK_MAX:
        return None
    return next((c for c in range(BLOCK_MAX, 63, -64) if k % c == 0), None)


def to_blocks(w: torch.Tensor, c: int) -> torch.Tensor:
    """A weight [N, K] as its K/c blocks of c columns, each a contiguous [N, c] matrix: [K/c, N, c] (chapter 02)."""
    n, k = w.shape
    if c < 1 or k % c:
        raise ValueError(f"a block of {c} columns does not divide rows of {k}")
    return w.reshape(n, k // c, c).transpose(0, 1).contiguous()


def from_blocks(wb: torch.Tensor) -> torch.Tensor:
    """The [N, K] weight back from its blocks [K/c, N, c] (chapter 02)."""
    j, n, c = wb.shape
    return wb.transpose(0, 1).reshape(n, j * c)


def _blocked_eager(wb: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    # each block's multiply-and-sum in fp32, then the blocks' partial sums added: one rounding to the weight's dtype
    return (wb * x.view(wb.shape[0], 1, wb.shape[2])).sum(-1, dtype=torch.float32).sum(0).to(wb.dtype)


def blocked_linear(x: torch.Tensor, wb: torch.Tensor) -> torch.Tensor:
    """x [..., K] @ w.T -> [..., N] for a weight stored as blocks [K/c, N, c] (`to_blocks`): one row by a compiled
    multiply-and-sum over every block at once, more rows by one matrix product per block, added (with the weight on
    the left for 2-32 rows where `rows_path` measured that faster) (chapter 02)."""
    j, n, c = wb.shape
    rows = x.numel() // x.shape[-1]
    if rows == 1:
        xv = x.reshape(-1)
        if torch.compiler.is_compiling():
            y = _blocked_eager(wb, xv)
        else:
            try:
                if not _BLOCKED:     # symbolic sizes, detached inputs, no autograd: as `mulsum`, few graphs
                    _BLOCKED.append(torch.compile(_blocked_eager, dynamic=True))
                with torch.no_grad():
                    y = _BLOCKED[0](wb.detach(), xv.detach())
            except Exception as e:   # noqa: BLE001 - the compiled product failed here: the same sum in eager
                _BLOCKED[:] = [_blocked_eager]
                print(f"note: the compiled blocked product failed ({type(e).__name__}); using eager PyTorch",
                      file=sys.stderr)
                y = _blocked_eager(wb, xv)
        return y.view(*x.shape[:-1], n)
    x2 = x.reshape(rows, j * c)
    if rows <= FEW_ROWS and rows_path(x.device, wb.dtype) == "wx":   # the weight on the left, as measured faster
        xb = x2.view(rows, j, c).transpose(0, 1)                   # [K/c, rows, c]
        return torch.bmm(wb, xb.transpose(1, 2)).sum(0).T.reshape(*x.shape[:-1], n)
    y = F.linear(x2[:, :c], wb[0])                                 # block by block into one output: no temporary
    for i in range(1, j):                                          # as large as K/c outputs (a long prefill's)
        y.addmm_(x2[:, i * c:(i + 1) * c], wb[i].T)
    return y.view(*x.shape[:-1], n)


def measure_blocks(device: torch.device | str | None = None, dtype: torch.dtype = torch.bfloat16, *,
                   nbytes: int = 256 * 2**20, shape: tuple[int, int] = LONG_ROWS, repeats: int = 5,
                   choose: bool = True) -> dict[str, float]:
    """Bytes/s of one-row products over about `nbytes` of long-row weights (`shape`, read in turn): "whole", rows
    as they are through the decoder's one-row path for that size, and "blocks", the same weights as blocks of
    `block_width` columns; `choose=True` has the decoder store its long-row weights as blocks on this device and
    dtype where they pay (`blocks_pay`). Only on a CPU (on a GPU, where many threads read each row, the book has not
    measured it) and only where torch.compile runs: else {} (chapter 02)."""
    dev = as_device(device)
    n, k = shape
    c = block_width(k)
    if dev.type != "cpu" or c is None:
        return {}
    ws = weight_stack(nbytes, n, k, dev, dtype)
    x = torch.randn(k, device=dev).to(dtype)
    size = sum(w.nbytes for w in ws)
    path = matvec_path(dev, dtype, ws[0].nbytes)
    try:
        bs = [to_blocks(w, c) for w in ws]
        want = matvec(ws[0], x, "linear").float()
        got = blocked_linear(x, bs[0]).float()
        if not (got - want).abs().max() / want.abs().max().clamp_min(1e-30) < 2e-2:
            raise RuntimeError("the blocked product gave a wrong result")
        whole = time_fn(lambda: [matvec(w, x, path) for w in ws], device=dev, warmup=1, repeats=repeats, number=None)
        blocks = time_fn(lambda: [blocked_linear(x, b) for b in bs], device=dev, warmup=1, repeats=repeats,
                         number=None)
    except Exception as e:   # noqa: BLE001 - no compiler, or a kernel that fails here: rows stay whole
        print(f"note: blocked weights not measured here ({type(e).__name__}); rows stay whole", file=sys.stderr)
        return {}
    rates = {"whole": size / whole.median, "blocks": size / blocks.median}
    if choose:
        set_row_blocks(dev, dtype, blocks_pay(rates))
    return rates


def blocks_pay(rates: dict[str, float] | None) -> bool:
    """Whether `measure_blocks`' rates ({"whole", "blocks"}) make blocks worth storing: at least BLOCKS_PAY times as
    fast (chapter 02)."""
    return bool(rates) and rates["blocks"] >= BLOCKS_PAY * rates["whole"]


def set_row_blocks(device: torch.device | str, dtype: torch.dtype, use: bool) -> None:
    """Record whether the decoder stores long-row weights as blocks on this device and dtype (chapter 02)."""
    _BLOCKS[(torch.device(device).type, dtype)] = bool(use)


def row_blocks(device: torch.device | str, dtype: torch.dtype, k: int) -> int | None:
    """Columns per block for a new weight with rows of `k` elements on this device and dtype, or None (rows stay
    whole): blocks only where `measure_blocks` found them faster (chapter 02)."""
    kind = device.type if isinstance(device, torch.device) else torch.device(device).type
    return block_width(k) if _BLOCKS.get((kind, dtype)) else None
