"""Where the keys and values live: the decoder's static cache (chapter 02) and a serving engine's slot and paged caches
(chapter 04).

- `KVCache`: one contiguous block per sequence of a fixed batch, the whole batch started together (`Llama.prefill`).
- `SlotCache`: a pool of slots; a sequence takes a free slot when it starts and reserves its maximum length there,
  whatever it ends up using (chapter 03's contiguous allocator).
- `PagedCache`: a pool of fixed-size blocks; a sequence takes blocks as it grows, and its block table says where its
  positions are; attention gathers them back in order (chapter 03's paged allocator, PagedAttention's idea).

Both pool caches serve `Llama.forward_packed` through the same four calls: `write_index` / `write` put each new
token's keys and values at its place, `read_index` / `read` give a group of sequences' keys and values [B,KV,S,hd].
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

__all__ = ["KVCache", "SlotCache", "PagedCache", "Segment", "Group", "Packed", "CacheFull"]


class KVCache:
    """Preallocated keys and values [layers, batch, KV heads, max_len, head dim] and per-sequence lengths (chapter 02).

    `lengths` lives on the host, so slicing to the filled prefix needs no device sync; rewinding is O(1).
    """

    def __init__(self, n_layers: int, batch: int, n_kv_heads: int, max_len: int, head_dim: int, *,
                 dtype: torch.dtype, device: torch.device | str):
        if batch < 1 or max_len < 1:
            raise ValueError(f"a KV cache needs batch >= 1 and max_len >= 1, got batch={batch}, max_len={max_len}")
        shape = (n_layers, batch, n_kv_heads, max_len, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.lengths = torch.zeros(0, dtype=torch.long)   # one entry per active sequence, on the host

    @property
    def batch(self) -> int:
        """Sequences the cache was allocated for (chapter 02)."""
        return self.k.shape[1]

    @property
    def max_len(self) -> int:
        """Positions the cache holds per sequence (chapter 02)."""
        return self.k.shape[3]

    @property
    def nbytes(self) -> int:
        """Bytes allocated for keys and values (chapter 02)."""
        return 2 * self.k.numel() * self.k.element_size()

    def reset(self, batch: int) -> None:
        """Start `batch` empty sequences (chapter 02)."""
        if batch > self.batch:
            raise ValueError(f"batch of {batch} sequences, but the KV cache was allocated for {self.batch}; "
                             f"call setup_cache(batch={batch}, ...) first")
        self.lengths = torch.zeros(batch, dtype=torch.long)

    def fill_random(self, batch: int, length: int, seed: int = 0) -> None:
        """Start `batch` sequences whose first `length` positions hold random keys and values, without computing
        them: a decode step can then be timed at any context (chapter 02)."""
        self.reset(batch)
        if not 0 <= length < self.max_len:
            raise ValueError(f"length must be in 0..{self.max_len - 1} (one position left to decode), got {length}")
        g = torch.Generator(device=self.k.device).manual_seed(seed)
        for t in (self.k, self.v):
            t[:, :batch, :, :length].normal_(generator=g)
        self.lengths = torch.full((batch,), length, dtype=torch.long)

    def seek(self, length: int) -> None:
        """Point every active sequence at its first `length` positions, back or forward, whatever they hold (random
        keys from `fill_random`, or an earlier step's): one cache serves decode steps timed at several contexts in
        turn (`book.decode.time_decode_steps`) (chapter 01)."""
        if self.lengths.numel() == 0:
            raise ValueError("no active sequences to seek: call reset or fill_random first")
        if not 0 <= length < self.max_len:
            raise ValueError(f"length must be in 0..{self.max_len - 1} (one position left to decode), got {length}")
        self.lengths = torch.full_like(self.lengths, length)

    def rewind(self, lengths: int | Sequence[int] | torch.Tensor) -> None:
        """Forget everything after `lengths` (one int for all sequences, or one per sequence); O(1) (chapter 02)."""
        new = torch.as_tensor(lengths, dtype=torch.long).cpu().flatten()
        if new.numel() == 1 and self.lengths.numel() != 1:
            new = new.expand(self.lengths.numel())
        if new.shape != self.lengths.shape:
            raise ValueError(f"rewind needs {self.lengths.numel()} lengths (one per sequence), got {new.numel()}")
        if (new < 0).any() or (new > self.lengths).any():
            raise ValueError(f"can only rewind to 0..current length; current {self.lengths.tolist()}, "
                             f"asked {new.tolist()}")
        self.lengths = new.clone()


class CacheFull(RuntimeError):
    """A pool cache has no room for what was asked (chapter 04); the engine preempts or waits."""


@dataclass(frozen=True)
class Segment:
    """Tokens of one sequence in one engine step: `tokens` at positions start, start+1, ...; `sample` says whether
    the step samples a next token after the last of them; `verify` asks for the logits after every one of them
    instead, to check drafted tokens (chapter 05) (chapter 04)."""
    seq: int
    tokens: tuple[int, ...]
    start: int
    sample: bool
    verify: bool = False


@dataclass(frozen=True)
class Group:
    """Sequences whose attention runs together: tokens lo:hi of the packed row are `batch` sequences x `T` tokens at
    query positions q_pos [batch,T], attending to the first kv_len positions of their caches (chapter 04)."""
    lo: int
    hi: int
    batch: int
    T: int
    q_pos: torch.Tensor
    kv_len: int
    read: tuple


@dataclass(frozen=True)
class Packed:
    """One engine step for `Llama.forward_packed`: every token of every segment in one row (chapter 04)."""
    tokens: torch.Tensor        # [N] token ids
    positions: torch.Tensor     # [N] each token's position in its own sequence
    write: tuple                # the cache's write index for the N tokens
    groups: tuple[Group, ...]   # the decodes together first, then one group per prefill chunk
    sample_at: torch.Tensor     # indices into the N tokens whose logits are wanted
    segments: tuple[Segment, ...]


class _Pool:
    """What the slot and paged caches share: K and V tensors, which sequence holds what, and `pack` (chapter 04)."""

    def __init__(self, k: torch.Tensor, v: torch.Tensor):
        self.k, self.v = k, v
        self.held: dict[int, list[int]] = {}     # sequence -> the slot or the blocks it holds

    @property
    def nbytes(self) -> int:
        """Bytes allocated for keys and values (chapter 04)."""
        return 2 * self.k.numel() * self.k.element_size()

    @property
    def device(self) -> torch.device:
        return self.k.device

    def free(self, seq: int) -> None:
        """Give back everything `seq` holds (it finished or was preempted) (chapter 04)."""
        self._release(self.held.pop(seq, []))

    def write(self, layer: int, index: tuple, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store the keys and values [N,KV,hd] of N new tokens at the places `index` names (chapter 04)."""
        a, b = index
        self._put(self.k[layer], a, b, k)
        self._put(self.v[layer], a, b, v)

    def pack(self, segments: Sequence[Segment]) -> Packed:
        """One step's segments as one row of tokens: single-token segments (decodes) first, shortest context first,
        attended in groups of similar length, then each longer one (a prefill or a chunk of one) on its own; every
        sequence must already hold room for its positions (`allocate`) (chapter 04)."""
        if not segments:
            raise ValueError("an engine step needs at least one segment")
        decodes = sorted((s for s in segments if len(s.tokens) == 1), key=lambda s: s.start)
        order = decodes + [s for s in segments if len(s.tokens) != 1]
        tokens, positions, seqs, groups, sample_at = [], [], [], [], []
        dev = self.device
        # Decodes attend together, each group padded to its longest context; a new group starts where padding would
        # more than double the positions read (one long sequence must not make every short one read its length).
        lo = 0
        for hi in range(1, len(decodes) + 1):
            if hi < len(decodes) and (decodes[hi].start + 1) * (hi + 1 - lo) <= 2 * sum(
                    d.start + 1 for d in decodes[lo:hi + 1]):
                continue
            pos = [d.start for d in decodes[lo:hi]]
            kv_len = max(pos) + 1
            groups.append(Group(lo, hi, hi - lo, 1, torch.tensor(pos, device=dev)[:, None], kv_len,
                                self.read_index([d.seq for d in decodes[lo:hi]], kv_len)))
            lo = hi
        for s in order:
            if not s.tokens:
                raise ValueError(f"sequence {s.seq}: a segment needs at least one token")
            n = len(tokens)
            if len(s.tokens) > 1:
                kv_len = s.start + len(s.tokens)
                q_pos = torch.arange(s.start, kv_len, device=dev)[None]
                groups.append(Group(n, n + len(s.tokens), 1, len(s.tokens), q_pos, kv_len,
                                    self.read_index([s.seq], kv_len)))
            tokens.extend(s.tokens)
            positions.extend(range(s.start, s.start + len(s.tokens)))
            seqs.extend([s.seq] * len(s.tokens))
            if s.verify:
                sample_at.extend(range(n, len(tokens)))
            elif s.sample:
                sample_at.append(len(tokens) - 1)
        return Packed(torch.tensor(tokens, device=dev), torch.tensor(positions, device=dev),
                      self.write_index(seqs, positions), tuple(groups),
                      torch.tensor(sample_at, dtype=torch.long, device=dev),
                      tuple(order))


class SlotCache(_Pool):
    """`n_slots` slots of `max_len` positions each: keys and values [layers, slots, KV heads, max_len, head dim]. A
    sequence takes one free slot for its whole life and reserves max_len positions there (chapter 04)."""

    def __init__(self, n_layers: int, n_slots: int, n_kv_heads: int, max_len: int, head_dim: int, *,
                 dtype: torch.dtype, device: torch.device | str):
        if n_slots < 1 or max_len < 1:
            raise ValueError(f"a slot cache needs n_slots >= 1 and max_len >= 1, got {n_slots} and {max_len}")
        shape = (n_layers, n_slots, n_kv_heads, max_len, head_dim)
        super().__init__(torch.zeros(shape, dtype=dtype, device=device),
                         torch.zeros(shape, dtype=dtype, device=device))
        self.max_len = max_len
        self.free_slots = list(range(n_slots - 1, -1, -1))      # pop() gives the lowest free slot

    @property
    def capacity(self) -> int:
        """Positions in the pool (chapter 04)."""
        return self.k.shape[1] * self.max_len

    @property
    def reserved(self) -> int:
        """Positions held by sequences, used or not: max_len per slot taken (chapter 04)."""
        return len(self.held) * self.max_len

    def fits(self, n: int) -> bool:
        """Whether one sequence of n positions could ever be held (chapter 04)."""
        return n <= self.max_len

    def can_start(self, n: int) -> bool:
        """Whether a new sequence needing n positions now can start now (chapter 04)."""
        return bool(self.free_slots) and n <= self.max_len

    def allocate(self, seq: int, n: int) -> None:
        """Make positions 0..n-1 of `seq` writable: its slot (taken on first call) holds max_len (chapter 04)."""
        if n > self.max_len:
            raise CacheFull(f"sequence {seq} needs {n} positions; a slot holds {self.max_len}")
        if seq not in self.held:
            if not self.free_slots:
                raise CacheFull(f"all {self.k.shape[1]} slots are taken")
            self.held[seq] = [self.free_slots.pop()]

    def _release(self, slots: list[int]) -> None:
        self.free_slots.extend(slots)
        self.free_slots.sort(reverse=True)

    def write_index(self, seqs: Sequence[int], positions: Sequence[int]) -> tuple:
        """(slot, position) of each new token (chapter 04)."""
        slots = [self.held[s][0] for s in seqs]
        return torch.tensor(slots, device=self.device), torch.tensor(positions, device=self.device)

    @staticmethod
    def _put(t: torch.Tensor, slots: torch.Tensor, pos: torch.Tensor, x: torch.Tensor) -> None:
        t[slots, :, pos] = x                                         # t [slots,KV,max_len,hd], x [N,KV,hd]

    def read_index(self, seqs: Sequence[int], length: int) -> tuple:
        """The slots of `seqs` (a slice when they are neighbours: no copy on read) and the length (chapter 04)."""
        slots = [self.held[s][0] for s in seqs]
        if slots == list(range(slots[0], slots[0] + len(slots))):
            return slice(slots[0], slots[0] + len(slots)), length
        return torch.tensor(slots, device=self.device), length

    def read(self, layer: int, index: tuple) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values [B,KV,length,hd] of the sequences `index` names (chapter 04)."""
        slots, length = index
        if isinstance(slots, slice):
            return self.k[layer][slots, :, :length], self.v[layer][slots, :, :length]
        return (self.k[layer][:, :, :length].index_select(0, slots),
                self.v[layer][:, :, :length].index_select(0, slots))


class PagedCache(_Pool):
    """`n_blocks` blocks of `block_size` positions: keys and values [layers, blocks, block_size, KV heads, head dim].
    A sequence takes a block when its last one is full; its block table lists them in order (chapter 04)."""

    def __init__(self, n_layers: int, n_blocks: int, n_kv_heads: int, block_size: int, head_dim: int, *,
                 dtype: torch.dtype, device: torch.device | str):
        if n_blocks < 1 or block_size < 1:
            raise ValueError(f"a paged cache needs n_blocks >= 1 and block_size >= 1, got {n_blocks} and "
                             f"{block_size}")
        shape = (n_layers, n_blocks, block_size, n_kv_heads, head_dim)
        super().__init__(torch.zeros(shape, dtype=dtype, device=device),
                         torch.zeros(shape, dtype=dtype, device=device))
        self.block_size = block_size
        self.free_blocks = list(range(n_blocks - 1, -1, -1))

    @property
    def capacity(self) -> int:
        """Positions in the pool (chapter 04)."""
        return self.k.shape[1] * self.block_size

    @property
    def reserved(self) -> int:
        """Positions held by sequences: whole blocks, so at most block_size - 1 unused per sequence (chapter 04)."""
        return sum(len(b) for b in self.held.values()) * self.block_size

    def blocks_for(self, n: int) -> int:
        """Blocks that hold n positions (chapter 04)."""
        return -(-n // self.block_size)

    def fits(self, n: int) -> bool:
        """Whether one sequence of n positions could ever be held (chapter 04)."""
        return self.blocks_for(n) <= self.k.shape[1]

    def can_start(self, n: int) -> bool:
        """Whether a new sequence needing n positions now can start now (chapter 04)."""
        return self.blocks_for(n) <= len(self.free_blocks)

    def allocate(self, seq: int, n: int) -> None:
        """Make positions 0..n-1 of `seq` writable, taking the blocks it lacks (chapter 04)."""
        table = self.held.setdefault(seq, [])
        need = self.blocks_for(n) - len(table)
        if need > len(self.free_blocks):
            if not table:
                del self.held[seq]
            raise CacheFull(f"sequence {seq} needs {need} more blocks; {len(self.free_blocks)} are free")
        for _ in range(need):
            table.append(self.free_blocks.pop())

    def _release(self, blocks: list[int]) -> None:
        self.free_blocks.extend(reversed(blocks))

    def write_index(self, seqs: Sequence[int], positions: Sequence[int]) -> tuple:
        """(block, offset in the block) of each new token, from the block tables (chapter 04)."""
        bs = self.block_size
        blocks = [self.held[s][p // bs] for s, p in zip(seqs, positions)]
        return (torch.tensor(blocks, device=self.device),
                torch.tensor([p % bs for p in positions], device=self.device))

    @staticmethod
    def _put(t: torch.Tensor, blocks: torch.Tensor, offsets: torch.Tensor, x: torch.Tensor) -> None:
        t[blocks, offsets] = x                                       # t [blocks,block_size,KV,hd], x [N,KV,hd]

    def read_index(self, seqs: Sequence[int], length: int) -> tuple:
        """The block tables of `seqs` as one [B, blocks] tensor (short tables padded with their last block: those
        positions lie beyond the sequence and the mask hides them) and the length (chapter 04)."""
        n = self.blocks_for(length)
        rows = []
        for s in seqs:
            t = self.held[s][:n]
            rows.append(t + [t[-1]] * (n - len(t)))
        return torch.tensor(rows, device=self.device), length

    def read(self, layer: int, index: tuple) -> tuple[torch.Tensor, torch.Tensor]:
        """Gather the blocks back in order: keys and values [B,KV,length,hd] (chapter 04)."""
        table, length = index
        B, n = table.shape
        bs, KV, hd = self.k.shape[2:]

        def gather(t: torch.Tensor) -> torch.Tensor:
            return t.index_select(0, table.view(-1)).view(B, n * bs, KV, hd)[:, :length].transpose(1, 2)

        return gather(self.k[layer]), gather(self.v[layer])
