"""The DSpark serial head walk in one persistent launch: `head_walk`.

Design (kernel.py has the kernel):
- Grid: P <= number of SMs programs, one per SM, all resident at once (they meet at a grid barrier every step,
  so the walk must be the only work that can occupy those SMs while it runs: launch it on one stream, no other
  persistent kernel beside it).
- Program p owns vocabulary rows [p * C, (p + 1) * C). Its first TILE rows of W2 stay in shared memory for the
  whole walk (TILE * r * 2 bytes = 128 KiB at r = 256 bf16); the other C - TILE rows are streamed every step
  (partial residency). At V = 32,000 every row is resident (125 programs x 256 rows); at V = 151,936 part of each
  shard is, the rest is read each step: by default through a TMA ring (stream_tma; Triton pipelines tensor-descriptor
  loads into shared-memory stages waited on with mbarriers), which needs some of the shared memory, so fewer rows
  stay resident (MEASURED_STREAMED_TMA).
- Per step and program: previous token from all programs' keys -> W1[x] (+ gate / RNN state) -> [B, r] @ [r, C]
  on tensor cores -> rounding as vLLM -> + U_k -> draft logits store (sampling) -> argmax or vLLM's Gumbel-max
  -> one int64 key per row -> grid barrier.
- Without CUDA (TRITON_INTERPRET=1) one program walks everything, no barrier.
"""
import logging
from dataclasses import dataclass, replace

import torch
import triton
from triton.runtime.errors import OutOfResources
from triton.tools.tensor_descriptor import TensorDescriptor

from .._log import log_once
from . import gluon_b1, gluon_rows
from .kernel import MAX_TOKENS, U_BOX_BYTES, expand_draft_logits_kernel, head_walk_kernel, noise_table_kernel

logger = logging.getLogger(__name__)

HEADS = {"markov": 0, "gated_markov": 1, "rnn": 2}
RESIDENCIES = ("auto", "full", "partial", "off")
# How the programs of a persistent walk agree on each step's token: "counter" (grid barrier on a counter, then
# every program reads all keys), "flags" (tagged keys, row 0's key written last with release semantics is the
# arrival flag), "tagged" (every key carries the step's tag: relaxed stores, each thread spins on its own
# slots, one CTA-wide max), "probe" (tagged keys; with several rows every thread first waits on its slot of
# column 0, then one batch of loads brings every live key and re-polls the few still missing), "poll" (that batch
# of loads and re-polls from the start), "amax" (every program folds its row bests into one [B] winners slot with
# atomic max, arrives on a step counter and reads the [B] winners back: traffic that does not grow with the
# programs), "auto" (choose_exchange). With one row, probe and poll are tagged.
EXCHANGES = ("auto", "counter", "flags", "tagged", "probe", "poll", "amax")
EXCHANGE_CODES = {"none": 0, "counter": 0, "flags": 1, "tagged": 2, "probe": 3, "poll": 4, "amax": 5}
# amax: int64 entries between two rows' winners. Packed (1) measured faster than a 128-byte line a row (16) at every
# batch (H200, 32k block 15, ladder v15 at 76ac2af: b8 71.5 vs 82.3 us, b32 119.8 vs 127.9, b64 140.8 vs 150.8).
WINNER_STRIDE = 1
MAX_WINNER_STRIDE = 4096
MAX_ROWS_PER_LAUNCH = 64
# With a reduced draft vocabulary (d2t) a walk of at least this many rows stores the step logits in a compact
# [B, N, V] buffer (contiguous draft columns, as a walk without d2t stores them) and one launch after the walk writes
# the cache's target-width rows whole (head_walk(compact_cache=)). Written at the scattered target columns inside the
# walk instead, the cache cost a sampled 32k -> 151,936 walk 79 / 328 us at b32 / b64 (ladder v43; the same walk
# without any cache: 166 / 311 us). Ladder v45 (ABBA x 2, direct / compact): b8 114 / 126, b16 119 / 143, b32 245 /
# 236, b64 638 / 491 us.
COMPACT_CACHE_MIN_ROWS = 32
# Several rows with d2t: whether each resident tile's d2t offsets are read once a walk (not every step). Ladder v47
# (ABBA, us, once a walk / every step): greedy b32 85.4 / 85.7 vs 88.8 / 88.3, sampled b64 458.6 / 459.0 vs 486.8 /
# 488.2, but sampled b32 246.5 / 246.5 vs 236.2 / 236.3 (and 174.6 / 173.8 vs 168.0 / 166.9 without the cache).
# None: once a walk except for sampled walks of up to D2T_HOIST_SAMPLED_MIN_ROWS - 1 rows; True / False: timing.
D2T_HOIST = None
D2T_HOIST_SAMPLED_MIN_ROWS = 33
# The whole-row launch: target columns and warps a program (one step of one row). Ladder v46: programs walking 5 or
# 15 steps with one read of their t2d block, blocks of 2048 / 8192: none faster (b64 492.6-507.1 vs 493.6-494.8 us);
# code at 3c2e8af.
EXPAND_BLOCK, EXPAND_WARPS = 4096, 4
# Bytes of W2 a program keeps resident: 128 KiB leaves room in the 227 KiB of shared memory a program may
# use for the streamed tiles' pipeline buffers.
RESIDENT_BYTES = 128 * 1024
# A barrier gives up (and flags barrier_errors) after this many polls, ~0.1-0.3 s, instead of hanging the GPU.
SPIN_LIMIT = 1 << 18
# A walk's programs wait on each other every step, so all of them must be resident at once. A plain launch starts
# programs as SMs free up: beside a kernel on another stream (async EPLB, MPS neighbours) the started ones spin
# until the rest get SMs, and a neighbour holding SMs longer than SPIN_LIMIT made the walk give up with stale keys
# (a sampled walk then loses exactness). A cooperative launch starts the grid only once every program is resident.
# Measured on the H200 (session 14, bench --neighbour-check, ladder v55): beside 16 programs holding SMs for 1.5 s,
# plain launches gave up (wrong tokens and caches), cooperative ones waited and matched the walk alone; no cost alone
# (ABBA, b1 / b8 / b32 / sampled / 152k within 1 %).
COOPERATIVE_LAUNCH = True
# Noise computed a step ahead (carried in registers, one fp32 per score a thread) up to this padded batch: none,
# measured slower at every batch (ladder v6: 32k sampled b8 +6%, b32 +5%, b64 +6%): the noise hid better behind
# the tile's dot and base-logit loads than behind the exchange.
NOISE_AHEAD_MAX_ROWS = 0
# noise_table: the batch rows (first, last) whose sampled walks make their noise before the walk by default. Ladder v62
# (H200, 32k, block 15, ABBA x 2, us incl. the table's launch, table vs inline): b8 94.2 / 95.7 vs 102.8 / 103.4; slower
# from 16 rows (b16 120.3 / 120.7 vs 108.4 / 108.3, b32 179.9 / 180.0 vs 173.5 / 173.7, b64 377.1 / 377.9 vs 340.8 /
# 340.1 (each tile's noise loaded just before it is scored: 365.5 / 364.8, removed, code at c6d9d5f), d2t b32 241.0 /
# 240.4 vs 222.4 / 222.3): the table's launch alone takes 14.2 / 49.1 / 94.5 us at b8 / b32 / b64, more than the walk
# saves by loading the noise. A table takes steps x rows x V x 4 bytes (15 x 64 x 32k: 123 MB), so none above
# NOISE_TABLE_MAX_BYTES. Ladder v63 (same form): b2 73.2 / 74.7 vs 100.9 / 100.8, b4 78.4 / 79.1 vs 101.0 / 101.8, b8
# 94.2 / 93.6 vs 102.4 / 102.0, d2t b8 with its cache 109.9 / 108.9 vs 114.7 / 114.3. Ladder v66, one row: 52.8 /
# 52.3 vs 54.9 / 55.3, but with the d2t and its cache (what 32k DSpark heads run) 57.7 / 58.8 vs 52.4 / 52.6: one row
# keeps the noise inline by default (noise_table=True still walks the table).
MEASURED_NOISE_TABLE_ROWS = (2, 8)
# Partly streamed shards (152k, 248k) take the table too, their streamed tiles' noise loaded beside their W2 rows:
# "ring" where the plan streams through the TMA ring (what bf16 W2 plans on the H200 do: measured and GPU-tested
# there), True in every streamed loop form (the register paths, e.g. fp8 W2: interpreter-tested only), False never.
# Ladder v73 (session 19, H200, ABBA x 2, us incl. the table's launch, table vs inline): 152k b2 400.6 / 401.9 vs
# 487.6 / 486.5, b4 431.0 / 431.2 vs 490.0 / 495.3, b8 475.9 / 475.6 vs 491.8 / 493.0; 248k b8 722.4 / 717.7 vs 761.9 /
# 768.8. Memory: the table is made per walk (15 steps x 8 rows: 73 MB at 152k, 119 MB at 248k); a CUDA graph captured
# at each batch size keeps its own.
NOISE_TABLE_STREAMED = "ring"
NOISE_TABLE_MAX_BYTES = 128 << 20
NOISE_TABLE_BLOCK = 1024
MAX_STREAM_STAGES = 8


@dataclass(frozen=True)
class WalkConfig:
    programs: int
    chunk_rows: int  # vocabulary rows a program owns
    block_rows: int  # batch rows padded to a power of two >= 16 (a dot operand's minimum)
    tile_rows: int  # rows of one resident tile
    resident_tiles: int
    stream_rows: int  # rows of one streamed tile
    multi: bool  # persistent, grid barriers between steps
    exchange: str  # with multi (amax: also lockstep): one of EXCHANGES but 'auto'; else 'none'
    lockstep: bool  # one launch per step
    num_warps: int
    num_stages: int
    keys_once: bool = True  # one CTA-wide key reduction per step, not one per tile
    prefetch: bool = True  # streamed W2 / U tiles double-buffered in registers
    # multi: the next step's U and (one row) the candidates' W1 rows prefetched into L1 during the exchange. Off:
    # measured slower (prefetch.global.L1 holds the warp, so the wait grew by a round trip).
    l1_prefetch: bool = False
    # Several rows: scores folded as a running fp32 value + int32 id max, one int64 key per row only at the end
    # of the step (off: an int64 key per element, session 3's scoring).
    split_keys: bool = True
    # split_keys: the step's last reduction as an fp32 max + int32 min of the ids holding it (False: one int64 key
    # per folded element, one reduction).
    pair_reduce: bool = True
    # split_keys for the streamed tiles too (False: they keep int64 keys). plan_walk: the measured scoring.
    split_streamed: bool = False
    # Sampled, several rows, batched exchanges: the next step's Gumbel noise computed while the keys travel.
    noise_ahead: bool = False
    # Partly streamed shards (with prefetch): streamed tiles bulk-prefetched into L2 this many tiles ahead (needs
    # row-contiguous W2 rows; 0: off).
    l2_prefetch: int = 0
    # Partly streamed shards: the streamed tiles come through tensor descriptors in a Triton-pipelined loop, a ring
    # of this many shared-memory stages filled by TMA and waited on with mbarriers (0: the register double buffer).
    stream_tma: int = 0
    # stream_tma: the streamed tiles' base logits through the ring too (False: pointer loads at the top of each
    # iteration: one mbarrier wait and one generic-to-async fence less an iteration).
    u_ring: bool = True
    # exchange 'amax': int64 entries between the rows' winners slots (WINNER_STRIDE).
    winner_stride: int = WINNER_STRIDE
    # Sampled, several rows, fully resident shards: every step's Gumbel noise made before the walk by
    # noise_table_kernel (at full occupancy), which the walk loads instead of computing it (choose_noise_table).
    noise_table: bool = False


def _interpreting() -> bool:
    # Triton fixes interpreter or compiler when the kernel is defined, not when it runs.
    return type(head_walk_kernel).__name__ == "InterpretedFunction"


def _num_sms(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count


# The fastest exchange for walks of up to this many batch rows, as measured (H200, V = 32k, block 15: the ladder
# of eval/results/head_walk.json, check ours_exchange_rule; eval/notes/head_walk.md has the times).
# Session 6 (run 11, ladder v16, same run): amax at b64, 140.9 vs poll 158.5 us greedy, 343.3 vs 425.8 sampled (its
# build keeps no [P, B] key tiles and does not spill).
MEASURED_EXCHANGES = ((1, "tagged"), (8, "poll"), (32, "probe"), (64, "amax"))
# Sampled walks of partly streamed shards (V = 152k), same run: amax at b8 / b32 / b64 (492.7 vs poll 548.5, 737.7 vs
# probe 771.4, 1336.8 vs poll 1469.5 us); greedy ones there follow MEASURED_EXCHANGES (b8 / b32 tie within 0.3%,
# b64 amax 530.8 vs 550.0).
MEASURED_EXCHANGES_STREAMED_SAMPLED = ((1, "tagged"), (8, "amax"), (32, "amax"), (64, "amax"))


# Several rows and a partly streamed shard (V = 152k): how the scores are reduced, as measured (H200, block 15,
# ladder v7 of eval/results/head_walk.json): "split" (running value + id max on every tile), "split_res" (on the
# resident tiles; the streamed ones keep int64 keys), "keys64" (an int64 key per score). Fully resident shards
# always split (ladder v6: 9-11% faster than int64 keys at 32k b8 / b32 / b64).
MEASURED_STREAMED_SCORING = ((8, "keys64"), (32, "split"), (64, "keys64"))


# Partly streamed shards (V = 152k): how many streamed tiles ahead each batch size bulk-prefetches into L2, as
# measured (eval/results/head_walk.json, ladders v9 and v11): greedy b8 -9%, b32 -11%; one row +4% and b64 +8%
# (spills) slower with it, so none there. Sampled walks (more registers: the prefetch made the b8 build spill)
# measured on their own: b8 +3% with it, b32 -1% with 2 tiles (+3% with 4).
MEASURED_STREAMED_L2_PREFETCH = ((1, 0), (8, 4), (32, 4), (64, 0))
MEASURED_STREAMED_L2_PREFETCH_SAMPLED = ((1, 0), (8, 0), (32, 2), (64, 0))


# Fully resident shards walked as one tile of WIDE_TILE_ROWS rows at these (padded batch rows, sampled), where the
# accumulator cap of plan_walk (4096 fp32 entries a tile) would give two tiles of 128 rows, each product waited on by
# itself with a shared-memory layout round trip between them. Ladder v59 (H200, 32k, block 15, r 256, ABBA x 2, us, one
# tile vs two): sampled b32 175.1 / 173.5 vs 189.2 / 189.7 (with d2t and the cache 223.3 / 221.9 vs 235.1 / 235.2),
# greedy b64 136.5 / 136.8 vs 139.7 / 139.6; not taken: greedy b32 86.0 / 85.6 vs 85.3 / 85.0 (b24 89.2 / 89.2 vs
# 91.9 / 92.0, d2t b32 84.5 / 83.8 vs 85.2 / 85.2: the same build, so no rule by batch inside it), sampled b64 (its
# one-tile build spills 672 B, triton 3.6: not timed). Up to 16 padded rows one tile already holds 256 rows. Markov
# heads only (the gated and RNN heads' builds were not timed with it).
MEASURED_WIDE_TILE = ((32, True), (64, False))
WIDE_TILE_ROWS = 256


# Partly streamed shards (V = 152k), 2-byte W2: (TMA ring stages, resident tile rows, resident tiles, warps) each batch
# size walks with by default, as measured (eval/results/head_walk.json, H200, block 15, same-run comparisons):
# ladder v12 (greedy): b1 4 stages + one resident tile of 128 rows 311.2 us vs the register double buffer 373.6 (-17%;
# 3 resident tiles of 64 rows 313.8); b8 3 stages + 3 tiles of 64 rows 328.2 vs 400.9 (-18%); b32 391.5 vs 469.3
# (-17%). (128 KiB resident + a ring of 16 KB tiles: 500-600 us, slower; 2 stages: 419.1.) Ladder v13: b1 at 4 warps
# 300.9 vs 310.8 at 8 (-3%; sampled, sweep vs ladder of the same run, 339.6 vs 392.7); b64 3 stages + 2 tiles of 64
# rows (its register path's residency) 549.7 vs 709.9 (-23%; sampled 1464.6 vs 1598.3, -8%); the sampled b8 / b32
# forms against their register paths side by side: 549.9 vs 629.8, 775.4 vs 942.2.
MEASURED_STREAMED_TMA = ((1, (4, 128, 1, 4)), (8, (3, 64, 3, 8)), (32, (3, 64, 3, 8)), (64, (3, 64, 2, 8)))


def choose_streamed_tma(num_rows: int) -> tuple[int, int, int, int]:
    return next((form for rows, form in MEASURED_STREAMED_TMA if num_rows <= rows), MEASURED_STREAMED_TMA[-1][1])


# Several rows of a Markov head over shards of 320..512 rows (a ~32k vocabulary on fewer SMs:
# GLUON_AUTO_FEW_SMS_CHUNK_ROWS): 256 rows resident and a 3-stage ring of 64-row tiles at 8 warps, greedy as 2 x 128-row
# tiles, sampled as one 256-row tile (the gated Markov and RNN heads, not measured there, keep choose_streamed_tma's).
# Session 20, call 5 at 7602a8a (H200, triton 3.6, plans for P SMs by programs=P, CUDA-graph replays, two interleaved
# samples, us a 15-step walk), vs choose_streamed_tma's (64-row tiles, 3 resident) at P = 114 / 78 / 66: greedy b2
# 86.6 / 113.3 / 122.9 vs 102.8 / 121.4 / 131.9, b4 86.6 / 113.5 / 123.0 vs 103.1 / 121.7 / 131.2, b8 87.3 / 114.0 /
# 123.2 vs 103.9 / 122.5 / 132.1, b16 92.1 / 119.5 / 135.9 vs 107.6 / 125.5 / 136.7 (b32: 121.7 / 163.9 / 179.2 vs
# 133.5 / 156.9 / 167.9, not taken); sampled b8 131.7 / 174.6 / 194.4 vs 157.7 / 185.9 / 200.8.
MEASURED_FEW_SMS_STREAMED_TMA = {False: (16, (3, 128, 2, 8)), True: (8, (3, 256, 1, 8))}


def choose_few_sms_tma(num_rows: int, sampled: bool, chunk_rows: int) -> tuple[int, int, int, int] | None:
    """The measured ring form for num_rows >= 2 rows over shards of GLUON_AUTO_FEW_SMS_CHUNK_ROWS, else None."""
    max_rows, form = MEASURED_FEW_SMS_STREAMED_TMA[bool(sampled)]
    return form if 2 <= num_rows <= max_rows and chunk_rows in GLUON_AUTO_FEW_SMS_CHUNK_ROWS else None


def choose_streamed_l2_prefetch(num_rows: int, sampled: bool = False) -> int:
    rule = MEASURED_STREAMED_L2_PREFETCH_SAMPLED if sampled else MEASURED_STREAMED_L2_PREFETCH
    return next((tiles for rows, tiles in rule if num_rows <= rows), rule[-1][1])


def choose_streamed_scoring(num_rows: int) -> str:
    return next((scoring for rows, scoring in MEASURED_STREAMED_SCORING if num_rows <= rows),
                MEASURED_STREAMED_SCORING[-1][1])


def choose_exchange(num_rows: int, sampled: bool = False, streamed: bool = False) -> str:
    """The exchange `exchange='auto'` uses for a walk of num_rows batch rows (MEASURED_EXCHANGES; sampled walks of
    partly streamed shards: MEASURED_EXCHANGES_STREAMED_SAMPLED): one row polls one key column (tagged); up to 32 rows
    the batched loads of every live key (poll / probe) beat the counter barrier, the per-thread spin and amax; at 64
    rows amax (atomic max into one winners slot) does."""
    rule = MEASURED_EXCHANGES_STREAMED_SAMPLED if sampled and streamed else MEASURED_EXCHANGES
    return next((exchange for rows, exchange in rule if num_rows <= rows), rule[-1][1])


def plan_walk(vocab: int, rank: int, num_rows: int, w2_elt_bytes: int, device: torch.device, *,
              residency: str = "auto", programs: int | None = None, lockstep: bool = False,
              tile_rows: int | None = None, resident_tiles: int | None = None, exchange: str = "auto",
              num_warps: int | None = None, num_stages: int | None = None, stream_rows: int | None = None,
              keys_once: bool = True, prefetch: bool = True, l1_prefetch: bool = False,
              split_keys: bool | None = None, pair_reduce: bool = True, split_streamed: bool | None = None,
              noise_ahead: bool | None = None, l2_prefetch: int | None = None, stream_tma: int | None = None,
              u_ring: bool = True, winner_stride: int = WINNER_STRIDE, noise_table: bool | None = None,
              sampled: bool = False, head: str = "markov") -> WalkConfig:
    """How the vocabulary is split over programs and how much of each shard stays on chip. stream_tma None: the
    measured TMA ring (choose_streamed_tma) where a GPU plan of 2-byte W2 streams part of each shard and no tile
    shape, residency or prefetch option is given; else none. noise_table None: MEASURED_NOISE_TABLE_ROWS' batches
    (the walk still takes a table only where choose_noise_table allows it). sampled, head: the walk's, for the
    measured rules."""
    tiles_given = tile_rows is not None or resident_tiles is not None or stream_rows is not None
    if residency not in RESIDENCIES:
        raise ValueError(f"residency must be one of {RESIDENCIES}, got {residency!r}")
    if exchange not in EXCHANGES:
        raise ValueError(f"exchange must be one of {EXCHANGES}, got {exchange!r}")
    if stream_rows is not None and (stream_rows < 16 or stream_rows & (stream_rows - 1)):
        raise ValueError(f"stream_rows must be a power of two >= 16, got {stream_rows}")
    if num_warps is not None and num_warps not in (4, 8, 16):
        raise ValueError(f"num_warps must be 4, 8 or 16, got {num_warps}")
    if l2_prefetch is not None and l2_prefetch < 0:
        raise ValueError(f"l2_prefetch must be >= 0, got {l2_prefetch}")
    if winner_stride < 1 or winner_stride > MAX_WINNER_STRIDE or winner_stride & (winner_stride - 1):
        raise ValueError(f"winner_stride must be a power of two in [1, {MAX_WINNER_STRIDE}], got {winner_stride}")
    if stream_tma is not None and not 0 <= stream_tma <= MAX_STREAM_STAGES:
        raise ValueError(f"stream_tma must be 0 (off) or a ring of 1..{MAX_STREAM_STAGES} stages, got {stream_tma}")
    if noise_table is not None and not isinstance(noise_table, bool):
        raise ValueError(f"noise_table must be None, True or False, got {noise_table!r}")
    block_rows = _block_rows(num_rows)
    # fp8 tiles are widened to bf16 for the tensor cores, which costs shared memory as if they were bf16.
    resident_rows = RESIDENT_BYTES // (rank * max(2, w2_elt_bytes))
    # A [tile_rows, block_rows] fp32 accumulator of 4096 entries is 16 registers a thread at 8 warps.
    tile_default = tile_rows is None
    if tile_default:
        tile_rows = min(256, max(64, 4096 // block_rows), resident_rows)
    stream_rows = stream_rows or 64
    on_gpu = device.type == "cuda" and not _interpreting()
    max_programs = _num_sms(device) if on_gpu else 1
    if programs is not None:
        if programs < 1:
            raise ValueError(f"programs must be >= 1, got {programs}")
        if on_gpu and programs > max_programs and not lockstep:
            raise ValueError(f"programs={programs} exceeds the {max_programs} SMs: all programs must be resident")
        max_programs = programs
    if on_gpu or programs is not None:
        chunk_rows = triton.cdiv(triton.cdiv(vocab, max_programs), stream_rows) * stream_rows
    else:
        chunk_rows = vocab
    num_programs = triton.cdiv(vocab, chunk_rows)
    if (tile_default and on_gpu and not lockstep and residency != "off" and w2_elt_bytes == 2 and head == "markov"
            and (block_rows, sampled) in MEASURED_WIDE_TILE and chunk_rows <= WIDE_TILE_ROWS <= resident_rows):
        tile_rows = WIDE_TILE_ROWS
    if not on_gpu:
        tile_rows = min(tile_rows, triton.next_power_of_2(chunk_rows))
    if residency == "off":
        resident_tiles = 0
    elif on_gpu:
        fit = min(4, max(1, resident_rows // tile_rows), triton.cdiv(chunk_rows, tile_rows))
        if chunk_rows > fit * tile_rows and block_rows >= 64:
            # The streamed tiles' pipeline buffers and the wide batch need the shared memory of two tiles.
            fit = min(fit, 2)
        resident_tiles = fit if resident_tiles is None else min(resident_tiles, fit)
    else:
        # One resident tile unless a test asks for more (the several-tile fold of the GPU plan, on the CPU).
        resident_tiles = 1 if resident_tiles is None else min(resident_tiles, 4, triton.cdiv(chunk_rows, tile_rows))
    if residency == "full" and chunk_rows > resident_tiles * tile_rows:
        raise ValueError(f"residency='full' needs each program's {chunk_rows} rows on chip, only "
                         f"{resident_tiles * tile_rows} fit: use 'partial' or 'auto'")
    # The amax exchange also runs its persistent form with one program (no wait can deadlock: the interpreter's
    # check of its epochs, slots and resets) and keeps its own lockstep form.
    multi = not lockstep and (on_gpu and num_programs > 1 or exchange == "amax" and num_programs == 1)
    lockstep = lockstep and num_programs > 1
    if not (multi or lockstep and exchange == "amax"):
        exchange = "none"
    # 'auto' is resolved below, once the plan knows whether the shard is partly streamed.
    streamed = chunk_rows > resident_tiles * tile_rows
    tma_form = None
    if stream_tma is None:
        tma_form = ((head == "markov" and choose_few_sms_tma(num_rows, sampled, chunk_rows)
                     or choose_streamed_tma(num_rows))
                    if streamed and on_gpu and residency == "auto" and not tiles_given and prefetch
                    and w2_elt_bytes == 2 else None)
        stream_tma = 0
    if tma_form is not None:
        stream_tma, tile_rows, resident_tiles, form_warps = tma_form
        num_warps = num_warps or form_warps
        resident_tiles = min(resident_tiles, triton.cdiv(chunk_rows, tile_rows))
        streamed = chunk_rows > resident_tiles * tile_rows
        # The ring forms were measured without the L2 bulk prefetch (with it: +3% at b1).
        l2_prefetch = 0 if l2_prefetch is None else l2_prefetch
    if l2_prefetch is None:
        l2_prefetch = choose_streamed_l2_prefetch(num_rows, sampled) if streamed and prefetch and on_gpu else 0
    if split_keys is None or split_streamed is None:
        scoring = choose_streamed_scoring(num_rows) if streamed else "split"
        split_keys = scoring != "keys64" if split_keys is None else split_keys
        split_streamed = scoring == "split" if split_streamed is None else split_streamed
    if exchange == "auto":
        exchange = choose_exchange(num_rows, sampled, streamed)
    if num_stages is None:
        # Fully resident shards stream nothing: no pipeline buffers to pay shared memory for. Triton does not
        # pipeline the streamed tiles' loads either (no cp.async / TMA in the sm_90 SASS): the register
        # double-buffer (prefetch) is the pipeline.
        num_stages = 1 if chunk_rows <= resident_tiles * tile_rows or prefetch else 2
    # Every row a program scores, padding rows past the vocabulary included, keys its id in ID bits below
    # MAX_TOKENS: a larger id would spill into the key's tag bits (a wait that never matches: stale keys).
    id_extent = num_programs * chunk_rows + max(tile_rows, stream_rows, 256)
    if id_extent > MAX_TOKENS:
        raise ValueError(f"a {vocab}-token vocabulary over {num_programs} programs of {chunk_rows} rows scores row ids "
                         f"up to ~{id_extent}, past the keys' {MAX_TOKENS} (vocabularies within a shard of it are not "
                         f"supported)")
    return WalkConfig(programs=num_programs, chunk_rows=chunk_rows, block_rows=block_rows, tile_rows=tile_rows,
                      resident_tiles=resident_tiles, stream_rows=stream_rows, multi=multi,
                      exchange=exchange, lockstep=lockstep,
                      num_warps=num_warps or 8, num_stages=num_stages, keys_once=keys_once,
                      prefetch=prefetch, l1_prefetch=l1_prefetch and multi, split_keys=split_keys,
                      pair_reduce=pair_reduce, split_streamed=split_streamed,
                      noise_ahead=NOISE_AHEAD_MAX_ROWS >= block_rows if noise_ahead is None else noise_ahead,
                      l2_prefetch=l2_prefetch, stream_tma=stream_tma if streamed else 0, u_ring=u_ring,
                      winner_stride=winner_stride,
                      noise_table=(MEASURED_NOISE_TABLE_ROWS[0] <= num_rows <= MEASURED_NOISE_TABLE_ROWS[1]
                                   if noise_table is None else noise_table))


def choose_noise_table(cfg: WalkConfig, num_rows: int, num_steps: int, vocab: int, sampled: bool) -> bool:
    """Whether a walk of this plan makes its noise before it (cfg.noise_table): sampled walks over fully resident
    shards, or partly streamed ones where NOISE_TABLE_STREAMED says so, whose table fits NOISE_TABLE_MAX_BYTES."""
    resident = cfg.chunk_rows <= cfg.resident_tiles * cfg.tile_rows
    streamed_ok = NOISE_TABLE_STREAMED is True or NOISE_TABLE_STREAMED == "ring" and cfg.stream_tma > 0
    return bool(cfg.noise_table and sampled and (resident or streamed_ok)
                and num_steps * num_rows * vocab * 4 <= NOISE_TABLE_MAX_BYTES)


_workspaces: dict = {}


# The batch widths a walk's buffers come in (plan_walk's block_rows).
BLOCK_ROWS_ALL = (16, 32, 64)
# Walk families with exchange buffers of their own. A tagged slot proves itself by its 14-bit tag ((gen + k) % 16383
# + 1), so a slot that some walk reads must have been written by every walk that advanced its buffers' `gen` since,
# or after the tags wrap around (16k steps) a key left behind could be taken for this step's. The Triton walk
# publishes all its width's columns every step; the Gluon walks publish only some (gluon_b1 column 0, gluon_rows
# the rows padded to a power of two >= 8) and gluon_rows' reducers fill only the inbox rows of its batch rows, so a
# Gluon walk gets buffers of its own row count ("layout"). A walk of one step writes only the first of the two
# slot halves (k % 2), so one-step walks get their own buffers too. A stale key would change greedy drafts only
# (vLLM verifies every draft), but a sampled draft must be the draw vLLM's rejection sampler is told about.
WORKSPACE_FAMILIES = ("triton", "gluon")


# Devices whose driver refused a cooperative walk launch ("too many blocks in cooperative launch": an MPS client held
# below the device's SM count): the programs of a persistent walk cannot all be resident there, so a plain launch
# would leave the started ones spinning for the rest until SPIN_LIMIT and walk on with stale keys (wrong drafts, and
# for a sampled walk a draft that is not the draw its cached logits describe). Their walks run one launch a step
# (lockstep: the launch boundary is the barrier), which needs no co-residency.
_cooperative_refused: set[str] = set()


class CooperativeLaunchRefused(RuntimeError):
    """The driver refused a persistent walk's cooperative launch; head_walk walks again in lockstep."""


def _cooperative(programs: int, device: torch.device | str) -> bool:
    """launch_cooperative_grid for a walk of `programs` programs (the interpreter runs programs one at a time)."""
    return (COOPERATIVE_LAUNCH and programs > 1 and not _interpreting()
            and (not _cooperative_refused or _device_name(device) not in _cooperative_refused))


def _lockstep_only(device: torch.device | str) -> bool:
    """Whether walks on `device` must run one launch a step (its driver refused a cooperative launch)."""
    return bool(_cooperative_refused) and _device_name(device) in _cooperative_refused


def _launch_walk(kernel, programs: int, device: torch.device, *args, coresident: bool = True, **kwargs) -> None:
    """kernel[(programs,)](*args, **kwargs): cooperatively where the programs wait on each other (coresident) and
    _cooperative says so. A driver that refuses the cooperative launch (CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE:
    "too many blocks in cooperative launch") is remembered per device and CooperativeLaunchRefused raised (nothing
    was launched), so that head_walk walks in lockstep."""
    if coresident and programs > 1 and _lockstep_only(device):
        # (a persistent walk this device cannot hold resident: launched plainly, it would give up with stale keys)
        raise CooperativeLaunchRefused(f"{device} refused a cooperative launch before: walk in lockstep")
    cooperative = coresident and _cooperative(programs, device)
    try:
        kernel[(programs,)](*args, **kwargs, launch_cooperative_grid=cooperative)
    except RuntimeError as exc:
        if not (cooperative and "cooperative" in str(exc)):
            raise
        _cooperative_refused.add(_device_name(device))
        log_once(logger, logging.WARNING, f"head_walk: the driver refused a cooperative launch of {programs} "
                 f"programs on {device} ({exc}), so they cannot all be resident at once (an MPS client below the "
                 f"device's SMs?); its walks run one launch a step from now on (slower, same drafts)")
        raise CooperativeLaunchRefused(str(exc)) from exc


def _device_name(device: torch.device | str) -> str:
    """The workspace keys' spelling of a device: with its index, as a tensor's device has one ("cuda" is the current
    CUDA device, "cuda:0" when that is device 0), so that "cuda" and "cuda:0" name the same buffers."""
    device = torch.device(device)
    backend = getattr(torch, device.type, None)
    if device.index is None and device.type != "cpu" and hasattr(backend, "current_device"):
        device = torch.device(device.type, backend.current_device())
    return str(device)


def _workspace_key(device: torch.device | str, programs: int, block_rows: int, rank: int,
                   family: str = "triton", layout: tuple = (0, False)) -> tuple:
    return (_device_name(device), programs, block_rows, rank, family, layout)


# The Triton walk's exchanges whose keys prove themselves by tags (amax resets its slots by epochs instead).
TAGGED_EXCHANGES = ("flags", "tagged", "probe", "poll")


def walk_layout(family: str, num_rows: int, num_steps: int, tagged: bool = True) -> tuple:
    """Which buffers of a family a walk of this shape exchanges through (WORKSPACE_FAMILIES' comment): (row count,
    or 0 for every row count of a width, as the Triton walk publishes them all; a tagged walk of one step)."""
    return (num_rows if family == "gluon" else 0, tagged and num_steps == 1)


def _block_rows(num_rows: int) -> int:
    """A walk's batch width (plan_walk's block_rows): its rows a launch padded to a power of two >= 16."""
    return max(16, triton.next_power_of_2(min(num_rows, MAX_ROWS_PER_LAUNCH)))


def _workspace(device: torch.device, programs: int, block_rows: int, rank: int, family: str = "triton",
               layout: tuple = (0, False)) -> dict:
    """Exchange buffers and the barrier counter, kept across calls: the counter only grows, so a walk needs no
    reset launch. One walk at a time per device (and per program count) may use them; each family
    (WORKSPACE_FAMILIES) and layout (walk_layout) has its own. Every width's and layout's buffers of every family
    are made at the first walk of a program count: a width first walked during CUDA-graph capture (vLLM captures its
    drafter's batch sizes after an eager profile run at its largest) would otherwise get buffers whose zero fill is
    only recorded in the graph, not done, and an eager walk of that width could read leftover tags."""
    if family not in WORKSPACE_FAMILIES:
        raise ValueError(f"family must be one of {WORKSPACE_FAMILIES}, got {family!r}")
    key = _workspace_key(device, programs, block_rows, rank, family, layout)
    if key not in _workspaces:
        shapes = {(block_rows, family, layout)}
        for one_step in (False, True):
            shapes.update((rows, "triton", (0, one_step)) for rows in BLOCK_ROWS_ALL)
            shapes.update((_block_rows(rows), "gluon", (rows, one_step))
                          for rows in range(1, gluon_rows.MAX_ROWS + 1))
        for rows, each_family, each_layout in sorted(shapes):
            shape_key = _workspace_key(device, programs, rows, rank, each_family, each_layout)
            if shape_key not in _workspaces:
                _workspaces[shape_key] = _new_workspace(device, programs, rows, rank, light=each_family == "gluon")
    return _workspaces[key]


def _new_workspace(device: torch.device, programs: int, block_rows: int, rank: int, light: bool = False) -> dict:
    """light: the Gluon walks' (tagged keys, inboxes, generations, the error flag), without the Triton walk's state
    exchange and amax slots."""
    # Zeros: tag 0 never matches a step's tag, where leftover memory could (flags / tagged exchanges).
    keys = torch.zeros(2, programs, block_rows, dtype=torch.int64, device=device)
    wsp = {
        "keys": keys,
        # The rows walk's inboxes (gluon_rows, EXCHANGE 1): each program's rows' winners, tagged like the keys.
        "inbox": torch.zeros_like(keys),
        "count": torch.zeros(1, dtype=torch.int64, device=device),
        "gen": torch.zeros(programs, dtype=torch.int64, device=device),
        "err": torch.zeros(1, dtype=torch.int32, device=device),
    }
    if light:
        return wsp
    wsp["state"] = torch.zeros(2, block_rows, rank, dtype=torch.float32, device=device)
    wsp["out"] = torch.zeros(2, block_rows, rank, dtype=torch.float32, device=device)
    _winner_slots(wsp, WINNER_STRIDE)  # the amax exchange's, in its default layout
    return wsp


def _winner_slots(wsp: dict, stride: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The amax exchange's three winners slots ([3, BP, stride] zeros: a slot's reset value) and their step counter
    (only grows). One pair per stride: a walk leaves the slots clean at its next two epochs in its own layout only."""
    if f"winners{stride}" not in wsp:
        block_rows = wsp["keys"].shape[2]
        wsp[f"winners{stride}"] = torch.zeros(3, block_rows, stride, dtype=torch.int64, device=wsp["keys"].device)
        wsp[f"arrive{stride}"] = torch.zeros(1, dtype=torch.int64, device=wsp["keys"].device)
    return wsp[f"winners{stride}"], wsp[f"arrive{stride}"]


def barrier_errors(device: torch.device | str = "cuda") -> int:
    """Nonzero when some walk's grid barrier gave up spinning (programs not co-resident): a bug or misuse. Counts the
    workspaces of every family on device ("cuda": the current CUDA device)."""
    name = _device_name(device)
    flags = [ws["err"] for k, ws in _workspaces.items() if k[0] == name]
    return int(torch.cat(flags).sum().item()) if flags else 0  # one read, not one per layout


# Tables derived from weights (folded gate / RNN projections, fp8 W2, d2t's tables), kept across walks: key ->
# _Table.
_tables: dict = {}
# Entries kept beyond this many are dropped oldest first, except those handed out while a CUDA graph was being
# captured: the graph reads that table at every replay, so it must live (at its address) as long as the process.
MAX_UNCAPTURED_TABLES = 8


@dataclass
class _Table:
    sources: tuple  # pinned: while the entry exists, no other tensor can take a source's address
    versions: tuple  # the sources' versions the value was made from
    value: object
    captured: bool = False  # handed out during a CUDA-graph capture: never dropped


def _cached(kind: str, sources: tuple[torch.Tensor, ...], make):
    """`make()` once per (kind, source tensors), identified by address, shape, strides, dtype, device; made again
    when a source changes in place (its version), into the same table.

    The entry holds references to its source tensors: an address is only a sound identity while the tensor lives.
    Keyed by address alone, a freed weight's address reused by a new weight of the same shape and dtype (the
    allocator does this readily, torch's CUDA caching allocator even more so) returned the freed weight's table,
    silently walking with the wrong weights. Pinned, the address cannot be reused while the entry exists, and any
    in-place change of a source (or a view of it) bumps the shared version counter.

    A changed source refreshes the table in place (its tensors overwritten, a plain value such as a bool replaced):
    a CUDA graph captured with the table keeps reading it at the same address, which a new table (and the old one
    freed) would leave dangling. During a capture the refresh is recorded into the graph (each replay redoes it) and
    the entry stays marked stale, so that the next eager walk refreshes it too.
    """
    key = (kind,) + tuple(_tensor_key(t) for t in sources)
    versions = _versions(sources)
    capturing = any(_capturing(t) for t in sources)
    entry = _tables.get(key)
    if entry is None:
        _drop_oldest_uncaptured()
        entry = _tables[key] = _Table(tuple(sources), versions, make())
    elif entry.versions != versions:
        entry.value = _refreshed(entry.value, make())
        if not capturing:
            entry.versions = versions
    entry.captured = entry.captured or capturing
    return entry.value


def _tensor_key(t: torch.Tensor):
    return (t.data_ptr(), tuple(t.shape), tuple(t.stride()), t.dtype, str(t.device))


def _versions(sources: tuple[torch.Tensor, ...]) -> tuple[int, ...]:
    return tuple(t._version for t in sources)


def _drop_oldest_uncaptured() -> None:
    """Makes room for one entry: the oldest entry never handed out during a capture goes (only eager walks, all
    launched already, ever read its table: the caching allocator reuses its memory in stream order)."""
    uncaptured = [key for key, entry in _tables.items() if not entry.captured]
    if len(uncaptured) >= MAX_UNCAPTURED_TABLES:
        del _tables[uncaptured[0]]


def _refreshed(table, new):
    """table with new's contents: a tensor (or tuple of tensors) of the same shapes and dtypes is overwritten in
    place and kept; anything else (a bool) is replaced by new."""
    olds, news = (table, new) if isinstance(table, tuple) else ((table,), (new,))
    if not (len(olds) == len(news) and all(isinstance(o, torch.Tensor) and isinstance(n, torch.Tensor)
                                           and o.shape == n.shape and o.dtype == n.dtype for o, n in zip(olds, news))):
        return new
    # vLLM walks under inference mode, so the table may be an inference tensor: writable only there.
    with torch.inference_mode():
        for old, fresh in zip(olds, news):
            old.copy_(fresh)
    return table


def draft_to_target_increases(d2t: torch.Tensor, while_capturing: bool | None = True) -> bool | None:
    """Whether id + d2t[id] strictly increases with id (vLLM builds d2t from a sorted draft vocabulary): a host read
    once per d2t (its identity and contents, as _cached keys them), never while a CUDA graph is being captured (the
    read would break the capture): a d2t first seen there gives `while_capturing`."""
    return _cached_outside_capture("d2t_increases", d2t, lambda: bool((d2t[1:] + 1 > d2t[:-1]).all()),
                                   while_capturing)


def _target_to_draft_table(d2t: torch.Tensor, target_vocab: int) -> torch.Tensor | None:
    """The cached [V_target] target -> draft id table of d2t; None while a CUDA graph is being captured and the
    table was never built: built there, it would be recorded, not filled, and read unfilled by anything that runs
    before the graph's first replay (the walk then stores at the target columns directly)."""
    return _cached_outside_capture(f"t2d_{target_vocab}", d2t, lambda: _target_to_draft(d2t, target_vocab), None)


def _cached_outside_capture(kind: str, source: torch.Tensor, make, while_capturing):
    """_cached(kind, (source,), make), except that during a CUDA-graph capture (kernels are recorded, not run) an
    entry not made yet, or made from a source changed since, is not made: `while_capturing` instead."""
    entry = _tables.get((kind, _tensor_key(source)))
    if _capturing(source):
        # A stale entry (source changed in place since) is as good as none: it is refreshed outside capture.
        if entry is None or entry.versions != _versions((source,)):
            return while_capturing
        entry.captured = True
        return entry.value
    return _cached(kind, (source,), make)


def _capturing(t: torch.Tensor) -> bool:
    """Whether work on t's device is being captured into a CUDA graph."""
    return t.is_cuda and torch.cuda.is_current_stream_capturing()


def quantize_w2_fp8(w2: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """W2 [r, V] -> (e4m3 rows [V, r], fp32 scale [V]) with one scale per vocabulary row."""
    rows = w2.t().float()
    scale = rows.abs().amax(dim=1).clamp(min=1e-12) / torch.finfo(torch.float8_e4m3fn).max
    return (rows / scale[:, None]).to(torch.float8_e4m3fn).contiguous(), scale.contiguous()


def _check(cond: bool, msg: str) -> None:
    if not cond:
        raise ValueError(msg)


def head_walk(
    base_logits: torch.Tensor,
    w1: torch.Tensor,
    w2: torch.Tensor,
    first_tokens: torch.Tensor,
    *,
    head: str = "markov",
    hidden: torch.Tensor | None = None,
    gate_weights: tuple[torch.Tensor, torch.Tensor] | None = None,
    rnn_weights: tuple[torch.Tensor, torch.Tensor] | None = None,
    temperature: torch.Tensor | None = None,
    top_k: int | None = None,
    top_p: float | None = None,
    seeds: torch.Tensor | None = None,
    positions: torch.Tensor | None = None,
    req_indices: torch.Tensor | None = None,
    draft_to_target: torch.Tensor | None = None,
    draft_to_target_increasing: bool = False,
    draft_logits: torch.Tensor | None = None,
    logit_scale: float = 1.0,
    confidence_weights: tuple[torch.Tensor, torch.Tensor] | None = None,
    residency: str = "auto",
    w2_dtype: torch.dtype | None = None,
    out: torch.Tensor | None = None,
    programs: int | None = None,
    lockstep: bool = False,
    tile_rows: int | None = None,
    resident_tiles: int | None = None,
    exchange: str = "auto",
    num_warps: int | None = None,
    num_stages: int | None = None,
    stream_rows: int | None = None,
    keys_once: bool = True,
    prefetch: bool = True,
    l1_prefetch: bool = False,
    split_keys: bool | None = None,
    pair_reduce: bool = True,
    split_streamed: bool | None = None,
    noise_ahead: bool | None = None,
    l2_prefetch: int | None = None,
    stream_tma: int | None = None,
    u_ring: bool = True,
    winner_stride: int = WINNER_STRIDE,
    noise_table: bool | None = None,
    compact_cache: bool | None = None,
    gluon: bool | str = "auto",
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """Walk DSpark's serial head over a block: B rows x N steps, one persistent launch.

    Step k (x_{-1} = first_tokens): e = W1[x_{k-1}]; m = e (markov) | sigmoid(Wg [h_k; e] + bg) * e
    (gated_markov) | tanh(o) of the RNN update (rnn, see naive.py); logits_k = U_k + scale * (m @ W2), rounded
    to U's dtype as vLLM rounds them; x_k = argmax(logits_k) (temperature None: vLLM's greedy drafts) or
    vLLM's Gumbel-max draw argmax(logits_k / T + G(seed ^ k << 32, positions[b, k] + 2**30, target id)).

    Args:
        base_logits: U [B, N, V] backbone logits over the draft vocabulary (fp32 / fp16 / bf16, last dim
            contiguous). Its dtype sets the rounding points.
        w1: [V_target, r] Markov embedding, indexed by target ids (vLLM: `markov_w1.weight`).
        w2: [r, V] Markov projection, any strides (vLLM's `markov_w2.weight` is [V, r]: pass `.t()`).
        first_tokens: [B] int target id of each row's anchor x_{-1}.
        head: "markov" (what vLLM 0.33 loads), "gated_markov" or "rnn" (DeepSpec's heads).
        hidden: [B, N, d] backbone hidden states, for gated_markov, rnn and the confidence head.
        gate_weights: (Wg [r, d + r], bg [r]), gate input [h_k; e].
        rnn_weights: (Wj [3r, 2r + d], bj [3r]), input [s; e; h_k], output rows [gate; candidate; out].
        temperature: [num_reqs] fp32 per request (0: greedy row); None: greedy walk with no noise at all.
        top_k, top_p: must be None: vLLM applies only the temperature to drafts (the rejection sampler keeps
            the output distribution exact anyway).
        seeds: [num_reqs] int64; positions: [B, N] int64 draw positions (vLLM's `sample_pos - 1`).
        req_indices: [B] request-state index of each row (indexes temperature, seeds, draft_logits); -1 marks
            a padding row. None: row b is request b.
        draft_to_target: [V] int64 offsets of a reduced draft vocabulary (vLLM's d2t): target = id + d2t[id].
        draft_to_target_increasing: id + d2t[id] strictly increases with id (vLLM builds d2t from a sorted draft
            vocabulary): target ids then order rows as draft ids do, so greedy keys may carry target ids (no d2t
            lookup after each step's exchange), and a greedy row of a fully resident shard may take the Gluon walk.
            Checked once per d2t (ValueError if wrong), except for a d2t first seen during CUDA-graph capture,
            where it stays the caller's promise.
        draft_logits: [num_reqs, >= N, V_target] cache to fill with each step's logits before temperature,
            at target-id columns (what vLLM's rejection sampler reads; pass `speculator.draft_logits`). With
            draft_to_target, the other columns of the walked steps are left as they are or set to -inf (as vLLM's
            walk writes them; see compact_cache).
        logit_scale: the LogitsProcessor scale applied to the Markov bias.
        confidence_weights: (wc [d + r] or [d], bc [1]): confidence_k = sigmoid(wc . [h_k; W1[x_{k-1}]] + bc).
        residency: "auto" | "full" (error if W2 does not fit on chip) | "partial" | "off" (stream all of W2).
        w2_dtype: None or torch.float8_e4m3fn (W2 quantized once per weight, one scale per vocabulary row).
        out: optional [B, N] int64 token buffer.
        exchange: how the programs agree on each step's token (EXCHANGES; 'auto': choose_exchange).
        programs, lockstep, tile_rows, resident_tiles, num_warps, num_stages, stream_rows (rows of a streamed
            W2 tile), keys_once (False: one key reduction per tile), prefetch (False: streamed tiles loaded when
            used), l1_prefetch (True: L1 prefetch of the next step's U / the candidates' W1 rows during the
            exchange), split_keys (False: int64 keys per score, not a running value + id max; split_streamed:
            also on streamed tiles; None: choose_streamed_scoring for partly streamed shards), pair_reduce (False:
            split_keys end with one int64 key reduction, not an fp32 max + int32 id min), noise_ahead
            (sampled: the next step's noise computed during the exchange; None: up to NOISE_AHEAD_MAX_ROWS
            padded rows), l2_prefetch (streamed tiles bulk-prefetched into L2 this many tiles ahead; None:
            choose_streamed_l2_prefetch for partly streamed shards), stream_tma (streamed tiles through a TMA ring
            of this many shared-memory stages; 0: the register double buffer; None: plan_walk's measured choice;
            needs 16-byte aligned rows of W2 and U and no fp8, else 0), u_ring (False: with stream_tma, the
            streamed tiles' base logits by pointer loads, not through the ring), winner_stride (exchange 'amax':
            int64 entries between the rows' winners, WINNER_STRIDE), noise_table (sampled walks over fully
            resident shards: every step's noise made before the walk and loaded by it; None: the
            measured rule, choose_noise_table), compact_cache (with draft_to_target and
            draft_logits: the walk stores draft columns in a compact buffer and a second launch writes the cache's
            walked rows whole, -inf outside the draft vocabulary; None: from COMPACT_CACHE_MIN_ROWS rows): launch
            overrides for tests and tuning.
        gluon: "auto" (default): gluon_b1's walk where it was measured faster than the Triton walk
            (why_not_gluon_auto: one greedy Markov row, shards of a measured size (V = 152k on 132 SMs, U rows
            aligned or not: partly streamed, form GLUON_AUTO_FORM with ring geometry GLUON_AUTO_GEOMETRY; fully
            resident shards of GLUON_AUTO_RESIDENT_CHUNK_ROWS (V = 32k class): GLUON_AUTO_RESIDENT_FORM /
            _GEOMETRY; V = 32k class on fewer SMs (GLUON_AUTO_FEW_SMS_CHUNK_ROWS): GLUON_AUTO_FEW_SMS_FORM /
            _GEOMETRY), sm_90, a measured Triton version,
            no launch option given); the Triton walk otherwise (a log line says why, once). False: always the
            Triton walk. True / "ss" / "rs": the Gluon streamed walk in the plan's geometry (W2's resident rows in
            shared memory; "rs": its first resident tile in registers; "rs_sf": "rs" scoring the ring's waiting
            tiles before the resident ones; "rs_sf_lean": "rs_sf" with a lean start and end; "rs2_sf_lean": that
            with a second resident tile in registers (384 resident rows); "..._pp": the slot spin with two reads in
            flight ("rs2_sf_lean_pp": auto's streamed form);
            "ss_lean_pair": fully resident shards (32k) too, with a lean start and end and both resident tiles'
            products in flight; "rs2_lean_pair": that with both tiles in registers; "rs2_lean_pair_pp": auto's
            resident form), where why_not_gluon_b1 allows it, else the Triton walk with a warning. "rows":
            gluon_rows' walk of 2..32 greedy Markov rows of fully resident shards (why_not_gluon_rows), which
            "auto" takes for 2..GLUON_AUTO_ROWS_MAX rows (why_not_gluon_rows_auto). A Gluon build that fails falls
            back the same way.
    Returns:
        (draft tokens [B, N] int64 target ids, draft_logits (the filled cache) or None,
         confidence [B, N] fp32 or None).
    """
    _check(head in HEADS, f"head must be one of {sorted(HEADS)}, got {head!r}")
    _check(base_logits.dim() == 3, f"base_logits must be [B, N, V], got shape {tuple(base_logits.shape)}")
    _check(base_logits.dtype in (torch.float32, torch.float16, torch.bfloat16),
           f"base_logits must be fp32/fp16/bf16, got {base_logits.dtype}")
    _check(base_logits.stride(-1) == 1, "base_logits must be contiguous along the vocabulary")
    num_rows, num_steps, vocab = base_logits.shape
    _check(w1.dim() == 2 and w2.dim() == 2, f"w1 [V_target, r] and w2 [r, V] must be 2-D, got {tuple(w1.shape)}, "
           f"{tuple(w2.shape)}")
    rank = w1.shape[1]
    _check(w2.shape == (rank, vocab), f"w2 must be [r={rank}, V={vocab}] (pass vLLM's markov_w2.weight.t()), "
           f"got {tuple(w2.shape)}")
    _check(rank >= 16 and rank & (rank - 1) == 0 and rank <= 1024, f"rank r must be a power of two in [16, 1024], "
           f"got {rank}")
    _check(w1.stride(1) == 1, "w1 rows must be contiguous")
    _check(w1.dtype in (torch.float32, torch.float16, torch.bfloat16) and w2.dtype in (torch.float32, torch.float16,
           torch.bfloat16), f"w1/w2 must be fp32/fp16/bf16, got {w1.dtype}/{w2.dtype}")
    _check(max(vocab, w1.shape[0]) <= MAX_TOKENS, f"vocabularies above {MAX_TOKENS} tokens are not supported")
    _check(first_tokens.shape == (num_rows,) and not first_tokens.is_floating_point(),
           f"first_tokens must be an int tensor [B={num_rows}], got {first_tokens.dtype} {tuple(first_tokens.shape)}")
    _check(top_k is None and top_p is None, "top_k/top_p must be None: vLLM applies only the temperature to drafts")
    sampled = temperature is not None
    _check(sampled == (seeds is not None) == (positions is not None),
           "temperature, seeds and positions go together (all or none)")
    if sampled:
        _check(positions.shape == (num_rows, num_steps), f"positions must be [B, N]={num_rows, num_steps}, got "
               f"{tuple(positions.shape)}")
        _check(temperature.dim() == 1 and seeds.dim() == 1 and not seeds.is_floating_point(),
               "temperature and seeds must be 1-D per-request tensors (seeds int64)")
    if req_indices is not None:
        _check(req_indices.shape == (num_rows,), f"req_indices must be [B={num_rows}]")
    if draft_to_target is not None:
        _check(draft_to_target.shape == (vocab,), f"draft_to_target must be [V={vocab}]")
        _check(not draft_to_target_increasing or draft_to_target_increases(draft_to_target),
               "draft_to_target_increasing=True, but id + draft_to_target[id] does not strictly increase with id: "
               "pass False (vLLM's wiring checks this itself)")
    if draft_logits is not None:
        _check(draft_logits.dim() == 3 and draft_logits.shape[1] >= num_steps and draft_logits.stride(-1) == 1,
               "draft_logits must be [num_reqs, >= N, V_target], contiguous along the vocabulary")
        # The walk stores draft id v at column v (no d2t) or at target id v + d2t[v] < W1's rows: a narrower cache
        # row would spill into the next step's or the next request's (vLLM's own sampler asserts the width).
        width = w1.shape[0] if draft_to_target is not None else vocab
        _check(draft_logits.shape[-1] >= width,
               f"draft_logits rows of {draft_logits.shape[-1]} columns cannot hold the "
               f"{'target' if draft_to_target is not None else 'draft'} vocabulary the walk writes ({width} ids)")
    if head != "markov":
        _check(hidden is not None and hidden.dim() == 3 and hidden.shape[:2] == (num_rows, num_steps),
               f"head {head!r} needs hidden [B, N, d]")
    _check(gluon in GLUON_FORMS, f"gluon must be one of {GLUON_FORMS}, got {gluon!r}")
    _check(l2_prefetch is None or l2_prefetch >= 0, f"l2_prefetch must be >= 0, got {l2_prefetch}")
    _check(stream_tma is None or 0 <= stream_tma <= MAX_STREAM_STAGES,
           f"stream_tma must be 0 (off) or a ring of 1..{MAX_STREAM_STAGES} stages, got {stream_tma}")
    if w2_dtype is not None:
        _check(w2_dtype == torch.float8_e4m3fn, f"w2_dtype must be None or torch.float8_e4m3fn, got {w2_dtype}")
    on_cuda = base_logits.device.type == "cuda"
    _check(on_cuda or _interpreting(), "head_walk needs a CUDA device or TRITON_INTERPRET=1")
    if num_rows == 0 or num_steps == 0:
        tokens = torch.empty(num_rows, num_steps, dtype=torch.long, device=base_logits.device)
        return tokens, draft_logits, None
    device = base_logits.device
    d_model = hidden.shape[-1] if hidden is not None else 0

    gh = t1 = hj = t3 = ws = None
    if head == "gated_markov":
        _check(gate_weights is not None, "head 'gated_markov' needs gate_weights=(Wg [r, d + r], bg [r])")
        wg, bg = gate_weights
        _check(wg.shape == (rank, d_model + rank) and bg.shape == (rank,),
               f"gate_weights must be ([r, d + r]={rank, d_model + rank}, [r]), got {tuple(wg.shape)}, "
               f"{tuple(bg.shape)}")
        # The gate's token half depends only on x: fold it into a [V_target, r] table once per weight.
        t1 = _cached("gate", (w1, wg),
                     lambda: (w1.float() @ wg[:, d_model:].float().t()).to(w1.dtype).contiguous())
        gh = (hidden.float() @ wg[:, :d_model].float().t() + bg.float()).contiguous()
    elif head == "rnn":
        _check(rnn_weights is not None, "head 'rnn' needs rnn_weights=(Wj [3r, 2r + d], bj [3r])")
        wj, bj = rnn_weights
        _check(wj.shape == (3 * rank, 2 * rank + d_model) and bj.shape == (3 * rank,),
               f"rnn_weights must be ([3r, 2r + d]={3 * rank, 2 * rank + d_model}, [3r]), got {tuple(wj.shape)}, "
               f"{tuple(bj.shape)}")
        t3 = _cached("rnn", (w1, wj),
                     lambda: (w1.float() @ wj[:, rank:2 * rank].float().t()).to(w1.dtype).contiguous())
        ws = _cached("rnn_s", (wj,), lambda: wj[:, :rank].float().contiguous())
        hj = (hidden.float() @ wj[:, 2 * rank:].float().t() + bj.float()).contiguous()
    conf_h = conf_w = None
    if confidence_weights is not None:
        _check(hidden is not None and hidden.dim() == 3, "confidence_weights need hidden [B, N, d]")
        wc, bc = confidence_weights
        wc = wc.reshape(-1).float()
        _check(wc.numel() in (d_model, d_model + rank), f"confidence weight must have d or d + r entries, got "
               f"{wc.numel()}")
        conf_h = (hidden.float() @ wc[:d_model] + bc.float().reshape(())).contiguous()
        conf_w = wc[d_model:].contiguous() if wc.numel() > d_model else torch.zeros(rank, device=device)

    w2_scale = None
    w2_rows = w2.t()  # [V, r] view
    if w2_dtype is not None:
        w2_rows, w2_scale = _cached("fp8", (w2,), lambda: quantize_w2_fp8(w2))
    plan_kw = dict(residency=residency, programs=programs, lockstep=lockstep, tile_rows=tile_rows,
                   resident_tiles=resident_tiles, exchange=exchange, num_warps=num_warps, num_stages=num_stages,
                   stream_rows=stream_rows, keys_once=keys_once, prefetch=prefetch, l1_prefetch=l1_prefetch,
                   split_keys=split_keys, pair_reduce=pair_reduce, split_streamed=split_streamed,
                   noise_ahead=noise_ahead, l2_prefetch=l2_prefetch, stream_tma=stream_tma, u_ring=u_ring,
                   winner_stride=winner_stride, noise_table=noise_table)
    # Launch options the caller changed from their defaults: gluon="auto" then leaves the walk to the Triton plan.
    overrides = sorted(name for name, value in plan_kw.items() if value != PLAN_DEFAULTS[name])
    if w2_dtype is not None:
        overrides.append("w2_dtype")

    def plan(ring_reads_u: bool = True, **geometry) -> WalkConfig:
        # The Triton ring also reads U by TMA; the Gluon walk's ring reads only W2 (ring_reads_u=False).
        kw = dict(plan_kw, **geometry)
        stream_ok = w2_scale is None and _tma_ok(w2_rows) and (_tma_ok(base_logits) or not ring_reads_u)
        kw.update(l2_prefetch=kw["l2_prefetch"] if w2_rows.stride(1) == 1 and w2_rows.stride(0) == rank else 0,
                  stream_tma=kw["stream_tma"] if stream_ok else 0)
        return plan_walk(vocab, rank, num_rows, w2_rows.element_size(), device, sampled=sampled, head=head, **kw)

    cfg = plan()
    if cfg.multi and _lockstep_only(device):
        # (this device refused a cooperative launch: a persistent walk's programs cannot all be resident there)
        cfg = plan(lockstep=True)
        gluon = False

    tokens = out if out is not None else torch.empty(num_rows, num_steps, dtype=torch.long, device=device)
    confidence = torch.empty(num_rows, num_steps, dtype=torch.float32, device=device) if conf_h is not None else None
    # (contiguous: the Gluon rows walk reads row b's anchor at first + b; vLLM 0.32's one-launch-per-step walk passes
    # the previous step's column of its [B, N] draft tokens)
    first_tokens = first_tokens.long().contiguous()
    d2t_keyed = draft_to_target is not None and draft_to_target_increasing
    if compact_cache is None:
        compact_cache = num_rows >= COMPACT_CACHE_MIN_ROWS
    # What keeps the Gluon walks off: an unordered d2t, a compact draft-logits cache (they store a cache themselves,
    # but its expansion is the Triton path's), confidence, strided tokens, a noise table over NOISE_TABLE_MAX_BYTES.
    gluon_extras = ((draft_to_target is not None and not d2t_keyed) or conf_h is not None or tokens.stride(-1) != 1
                    or compact_cache and draft_logits is not None and draft_to_target is not None
                    or sampled and num_steps * num_rows * vocab * 4 > NOISE_TABLE_MAX_BYTES)
    draw = dict(req_indices=req_indices, temperature=temperature, seeds=seeds, positions=positions,
                draft_logits=draft_logits)

    def walk_gluon() -> bool:
        """The Gluon walk where `gluon` and the case allow it (True: it walked); False: the Triton walk's turn."""
        if gluon == "rows" or gluon == "auto" and num_rows > 1:
            rows_case = dict(
                num_rows=num_rows, head=head, sampled=sampled, cache=draft_logits is not None,
                extras=gluon_extras, d2t=d2t_keyed, dtypes=(w1.dtype, w2_rows.dtype, base_logits.dtype),
                rank=rank, capability=torch.cuda.get_device_capability(device) if on_cuda else None,
                w2_tma=_tma_ok(w2_rows))
            if gluon == "auto":
                reason = why_not_gluon_rows_auto(cfg, overrides=overrides, **rows_case)
                if reason is not None:
                    log_once(logger, logging.INFO, f"head_walk(gluon='auto'): the Triton walk: {reason}")
            else:
                reason = why_not_gluon_rows(cfg, **rows_case)
                if reason is not None:
                    log_once(logger, logging.WARNING, f"head_walk(gluon='rows'): walking the Triton kernel: {reason}")
            return reason is None and _launch_gluon_rows(cfg, base_logits, w1, w2_rows, first_tokens, tokens,
                                                         logit_scale, d2t=draft_to_target if d2t_keyed else None,
                                                         draw=draw)
        if gluon is not False:
            gluon_case = dict(
                num_rows=num_rows, head=head, sampled=sampled, cache=draft_logits is not None,
                extras=gluon_extras, d2t=d2t_keyed, target_vocab=w1.shape[0],
                dtypes=(w1.dtype, w2_rows.dtype, base_logits.dtype), rank=rank,
                capability=torch.cuda.get_device_capability(device) if on_cuda else None, w2_tma=_tma_ok(w2_rows))
            form, auto_geometry = gluon_auto_form(cfg) if gluon == "auto" else (gluon, None)
            flags = gluon_form_flags(form)
            if gluon == "auto":
                reason = why_not_gluon_auto(cfg, overrides=overrides, **gluon_case)
                if reason is None:
                    gluon_cfg, reason = gluon_auto_plan(plan, auto_geometry)
                if reason is None:
                    reason = why_not_gluon_b1(gluon_cfg, rs=flags["rs"], lean=flags["lean_ends"], **gluon_case)
                if reason is not None:
                    log_once(logger, logging.INFO, f"head_walk(gluon='auto'): the Triton walk: {reason}")
            else:
                gluon_cfg = plan(ring_reads_u=False)
                reason = why_not_gluon_b1(gluon_cfg, rs=flags["rs"], lean=flags["lean_ends"], **gluon_case)
                if reason is not None:
                    log_once(logger, logging.WARNING,
                             f"head_walk(gluon={gluon!r}): walking the Triton kernel: {reason}")
            return reason is None and _launch_gluon_b1(gluon_cfg, base_logits, w1, w2_rows, first_tokens, tokens,
                                                       logit_scale, d2t=draft_to_target if d2t_keyed else None,
                                                       draw=draw, **flags)
        return False

    def walk_triton(cfg: WalkConfig) -> None:
        compact = t2d = None
        if draft_to_target is not None and draft_logits is not None:
            # Built by any walk outside graph capture (not only compact ones), so that a capture finds it.
            t2d = _target_to_draft_table(draft_to_target, draft_logits.shape[-1])
        if compact_cache and t2d is not None:
            compact = torch.empty(num_rows, num_steps, vocab, dtype=draft_logits.dtype, device=device)
        for g0 in range(0, num_rows, MAX_ROWS_PER_LAUNCH):
            g = slice(g0, min(num_rows, g0 + MAX_ROWS_PER_LAUNCH))
            rows_req = req_indices[g] if req_indices is not None else (
                None if num_rows <= MAX_ROWS_PER_LAUNCH else torch.arange(g.start, g.stop, device=device))
            _launch(cfg, base_logits[g], w1, w2_rows, w2_scale, first_tokens[g].contiguous(), tokens[g], rows_req,
                    temperature, seeds, positions[g] if sampled else None, draft_to_target,
                    draft_logits if compact is None else compact[g],
                    conf_h[g] if conf_h is not None else None, conf_w, None if confidence is None else confidence[g],
                    gh[g] if gh is not None else None, t1, hj[g] if hj is not None else None, t3, ws,
                    HEADS[head], logit_scale, compact_logits=compact is not None,
                    d2t_increasing=draft_to_target is not None and draft_to_target_increasing)
        if compact is not None:
            _expand_draft_logits(compact, draft_logits, req_indices, t2d)

    # A refused cooperative launch (CooperativeLaunchRefused) launched nothing: the call walks again in lockstep.
    try:
        if not walk_gluon():
            walk_triton(cfg)
    except CooperativeLaunchRefused:
        walk_triton(plan(lockstep=True))
    return tokens, draft_logits, confidence


def _target_to_draft(d2t: torch.Tensor, target_vocab: int) -> torch.Tensor:
    """[V_target] int32: the draft id mapped to each target id, -1 where none is."""
    draft_ids = torch.arange(d2t.numel(), device=d2t.device)
    t2d = torch.full((target_vocab,), -1, dtype=torch.int32, device=d2t.device)
    t2d[draft_ids + d2t] = draft_ids.to(torch.int32)
    return t2d


def _expand_draft_logits(compact: torch.Tensor, cache: torch.Tensor, req_indices: torch.Tensor | None,
                         t2d: torch.Tensor) -> None:
    """The walked steps' cache rows [req, k, :V_target] from the compact [B, N, V] draft logits, written whole
    (t2d: _target_to_draft_table)."""
    num_rows, num_steps, _ = compact.shape
    target_vocab = cache.shape[-1]
    expand_draft_logits_kernel[(triton.cdiv(target_vocab, EXPAND_BLOCK), num_steps, num_rows)](
        compact, compact.stride(0), compact.stride(1), cache, cache.stride(0), cache.stride(1),
        req_indices if req_indices is not None else compact, t2d, target_vocab, HAS_REQ=req_indices is not None,
        BLOCK=EXPAND_BLOCK, num_warps=EXPAND_WARPS)


# head_walk(gluon=...): "auto" (why_not_gluon_auto decides), False (the Triton walk), True / "ss" (gluon_b1's streamed
# walk, resident W2 rows in shared memory), "rs" (its first resident tile in registers as the wgmma A operand),
# "rs_sf" ("rs" that scores the ring's STAGES waiting tiles before the resident ones, so their refills leave before
# the resident work; auto's form from ladder v23 to HW11).
# Session 6's "ss_once" / "ss_late" (one early candidate guess / none) measured slower (session 7, ladder v19, 152k
# b1: 311.7 / 301.0 vs 296.6 us); code at eee43d2. HW8's "rs_ws" / "rs_ws_sf" (a producer warp refills the ring)
# measured no faster than "rs" / "rs_sf" (ladder v23: 249.9 vs 247.7 / 251.9; 236.5 / 242.0 vs 235.6 / 236.2 us);
# code at 89ba734. HW9's "rs_sf_pf1".."rs_sf_pf4" (the next step's 1..4 streamed tiles after the ring's bulk-
# prefetched into L2 once a step) measured slower than "rs_sf" (ladder v24: 235.4 / 237.8 .. 255.3 / 256.2 vs
# 234.6 / 234.4 us); code at bff8a73. HW9's "rs_sf_w1" (each program's best token's W1 row bulk-prefetched into L2
# as it publishes its key) measured no faster (ladder v25, three pairs: 239.9 / 239.2 / 240.7 vs 239.0 / 236.9 /
# 237.5 us); code at b4da3f0.
# HW11's "rs_sf_lean" (auto's form since HW11's call B): "rs_sf" with lean ends: the shared-memory resident tile by
# TMA, step 0's base logits and the anchor's W1 row issued before the register tile; in the last step only program 0
# waits (for the winner's key, no W1 gather), the others leave after publishing.
# HW12 (fully resident shards, V = 32k: the streamed kernel with no streamed tile): "ss_lean_pair" (opt-in, the next
# default candidate: the lean start, both 128-row tiles by TMA issued before step 0's base logits and anchor W1 row;
# both tiles' products in flight with one wait; only program 0 waits in the last step). Measured and removed (code at
# ee2fd3a / 8a7cc6a): "ss_lean" (the same without the pairing: auto's form after call A, under the Triton walk by only
# 1.49 % in call B's 7 pairs, and 4.5 % slower than ss_lean_pair), "rs_lean", "ss_lean_late" / "rs_lean_late" (no
# candidate guess: slower), and the Triton walk's lean start (lean_start: its tile by one TMA copy, no gain).
# Session 10's "rs2_sf_lean" (auto's streamed form since ladder v35): rs_sf_lean with the second resident tile in
# registers too (two warpgroups x 64 rows x 2 tiles: 128 registers a thread of W2; ptxas 255 registers + 104 B of
# stack), on top of the plan's two resident tiles: 384 resident rows, 6 streamed tiles a step instead of 7 (the 152k
# step is bound by its streamed bytes: 52 MB instead of 60.6).
# Session 10's "rs2_lean_pair" (auto's resident form from ladder v36 to v39): ss_lean_pair with both tiles in registers,
# staged through shared memory by TMA (RS_TMA). "..._pp" (ladder v39; auto's forms since): the slot spin keeps
# SPIN_READS reads of a slot in flight, SPIN_STAGGER cycles apart. Measured slower and removed (code at 22173a2 /
# 3d900f7 / c5674c2): "..._fix" (only the winning column's W1 row fixed after the agreement), "..._dfr" (step 0 from
# the staging buffer, registers filled during its exchange; as a branch in the loop and peeled), "..._sw" (tile 0
# scored while tile 1's product is in flight).
# HW13's "rs_sf_lean_pair" (rs_sf_lean with its register and shared-memory resident tiles' products in flight with one
# wait, PAIRED beside streamed tiles) measured slower than rs_sf_lean (ladder v34, 7 pairs, median -0.6 %; block 7
# equal): removed, code at f8823db.
# Session 12's "rows" (opt-in): gluon_rows' walk of 2..32 greedy Markov rows of fully resident shards (each batch row
# polled by one warp, the one-row walk's guessed W1 rows and pipelined spin).
GLUON_FORMS = ("auto", False, True, "ss", "rs", "rs_sf", "rs_sf_lean", "rs2_sf_lean", "ss_lean_pair",
               "rs2_lean_pair", "rs2_sf_lean_pp", "rs2_lean_pair_pp", "rows")


def gluon_form_flags(form: bool | str) -> dict[str, bool | int]:
    """_launch_gluon_b1's flags of an explicit gluon= form: rs (register tiles: "rs2..." 2, "rs..." 1, else 0; the
    second register tile comes on top of the plan's resident rows, see _gluon_stream_form), stream_first
    ("..._sf...": the ring's waiting tiles before the resident ones each step), lean_ends ("..._lean...": the lean
    start and end), paired ("..._pair": the two resident tiles' products in flight with one wait, gluon_b1's PAIRED),
    pipelined_spin ("..._pp": SPIN_READS reads of a slot in flight, SPIN_STAGGER cycles apart)."""
    name = "ss" if form is True else form
    return dict(rs=2 if name.startswith("rs2") else int(name.startswith("rs")), stream_first="_sf" in name,
                lean_ends="_lean" in name, paired="_pair" in name, pipelined_spin="_pp" in name)


# Candidate guesses per step (gluon_b1._next_candidates).
GUESS_ROUNDS = 3
# The "..._pp" forms' reads of a slot in flight and the stagger between them (clock cycles;
# gluon_b1._pipelined_spin_ptx).
SPIN_READS = 2
SPIN_STAGGER = 600
# gluon="auto": the Gluon walk where it was measured faster than the Triton walk, in its fastest measured form.
# Session 7 (H200, triton 3.6, ladder v19, one run, 152k b1 block 15): "rs" with 256 resident rows (64 in registers)
# and a 3-stage ring 278.0 us vs the Triton default 304.6 / 304.4 (ss in the plan's 4-stage / 128-row geometry 296.6,
# rs 298.3, ss res192 s3 289.4, rs res192 s4 285.2); ladder v21 (as the default): 276.4 / 281.6 vs 306.0 / 307.0, the
# same form with a 2-stage ring 292.2. Ladder v22 (HW7b, one run): 128-row tiles at 8 warps (two warpgroups, 128 rows
# in registers + 128 in shared memory, 2 ring stages of 128 rows: 7 streamed iterations a step, not 14) 245.4 / 244.4
# vs that form 273.3 / 273.2 (Triton 300.5; 128 rows in registers only + 3 stages 271.4); 150001 250.0 vs 283.6;
# block 7 120.6 vs 137.0. Ladder v23 (session 8, lead's call 1 at 89ba734, one run): "rs_sf" (the ring's 2 waiting
# tiles scored before the resident ones) 235.6 / 236.2 vs "rs" 247.7 / 251.9 us (HW8's rule: > 2 % in both pairs).
# HW11 (session 8, ladders v29 / v30 at 9218c19 / f6f748b): "rs_sf_lean" (resident tile by TMA, step 0's loads first,
# only program 0 waiting in the last step) under "rs_sf" in 6 of 7 interleaved 152k block-15 pairs (call B: -0.9 /
# -2.2 / -1.9 / -2.6 % and -2.1 / -1.6 / -2.2 % on the sweep's 3 fresh allocations, median 2.1 %; call A: -2.3 / -1.9
# / -0.3 %), 150001 -1.8 %, block 7 -3.1 %.
# Session 10 (ladder v35 at ae7289c, one call): "rs2_sf_lean" (second resident tile in registers) under rs_sf_lean in
# 7 of 7 pairs: ABBA 218.0 / 214.8 / 217.1 / 215.0 vs 230.8 / 232.5 / 231.8 / 232.1 us, sweep samples on the same 3
# allocations -6.8 / -5.4 / -6.0 % (218.7 vs 231.2, graph loop 581.4: 2.66x); 150001 218.6 vs 237.5; block 7 110.1 vs
# 113.6; its GPU tests (token-identical at 152k / 150001, blocks 15 / 7, 3 seeds; graph replays as auto) passed.
# Session 10 (ladder v39 at 8a53529): "rs2_sf_lean_pp" (the slot spin with two reads in flight) 213.2 / 214.5 vs
# 218.5 / 220.3 us in two ABBA pairs (-2.4 / -2.6 %); its GPU tests passed.
GLUON_AUTO_FORM = "rs2_sf_lean_pp"
GLUON_AUTO_GEOMETRY = dict(stream_tma=2, tile_rows=128, resident_tiles=2, stream_rows=128)
# Shard sizes it was measured at (V = 151,936 and 150,001 on 132 SMs: 1,152 rows a program). 150,001 bf16 has U rows
# TMA cannot read (no Triton ring there; the Gluon walk loads U by pointer and keeps its W2 ring): measured in that
# exact form (session 7, ladder v21, same run) 273.1 vs the Triton register path 372.7 us (152k in the same run:
# default 276.4 / 281.6 vs Triton 306.0 / 307.0; block 7 138.7 vs 146.4); v22's 128-row form 250.0 vs 372.6.
# Session 19 (ladder v72, H200, triton 3.6, ABBA x 2, us a 15-step b1 walk): Qwen3.5 / 3.6's 248,320-token vocabulary
# (130 programs of 1,920 rows) 452.7 / 452.1 vs the Triton walk's 467.2 / 471.2 greedy, 490.0 / 488.6 vs 511.2 / 508.1
# sampled with its cache.
# Those two shard sizes (1,152 and 1,920 rows) were the whole rule until session 20, which measured the range:
# partly streamed shards of 1,152..3,776 rows (152k and 248k on fewer SMs too): session 20, call 5 at 7602a8a (H200,
# triton 3.6, plans for P SMs by programs=P, CUDA-graph replays, two interleaved samples, us a 15-step greedy b1 walk),
# the streamed form vs the Triton walk at P = 114 / 78 / 66: 152k (Triton shards of 1,344 / 1,984 / 2,304 rows) 248.3 /
# 289.4 / 304.8 vs 302.4 / 317.4 / 343.6; 248k (2,240 / 3,200 / 3,776) 441.8 / 466.1 / 470.9 vs 463.9 / 485.8 / 537.5.
# Sampled only where MEASURED_GLUON_DRAW_CHUNK_ROWS says (past ~2,048 rows the draw's noise does not fit beside the
# ring: why_not_gluon_b1 keeps the Triton walk).
GLUON_AUTO_STREAMED_CHUNK_RANGE = (1152, 3776)
# Fully resident shards (HW12, H200, triton 3.6, 32k b1 block 15: 125 programs of 256 rows): ss_lean_pair in two
# 128-row tiles at 8 warps. Ladder v32 (call B at 8a7cc6a): under the Triton walk in all 7 interleaved pairs (median
# -6.0 %; block 7 23.5 vs 24.9, block 1 7.1 vs 8.0). Adopted by ladder v33 (session 9, lead, at af63436): its 26 GPU
# tests as auto's form passed; ladder 43.7 / 44.1 / 44.6 / 45.0 vs the Triton walk's 46.9 / 47.6 / 47.0 / 46.8 us, and
# the sweep row with it as auto 44.4 (44.2 / 44.4 / 44.5) vs 47.3 (46.6 / 47.5 / 47.3) on the same allocations.
# 30011 (same shard size) is GPU-tested for tokens, not timed.
# Session 10 (ladder v36 at 88d5fad, one call): "rs2_lean_pair" (both tiles in registers, brought there by TMA through
# shared memory; the steps read no W2 from shared memory) under ss_lean_pair in 7 of 7 pairs: ABBA 41.3 / 42.6 / 42.3 /
# 41.3 vs 44.1 / 44.4 / 45.1 / 44.0 us, sweep samples on the same 3 allocations -3.6 / -5.4 / -4.8 % (41.9 vs 44.3;
# graph loop 266.2: 6.35x, fused step 121.0: 2.89x); block 7 22.2 vs 23.4, block 1 7.8 vs 7.4 (the staging costs
# ~0.4 us once, the steps ~0.2 us less each); its GPU tests (32k / 30011, blocks 15 / 7 / 1, graph replays) passed.
# Ladder v39 (session 10, at 8a53529): "rs2_lean_pair_pp" (the slot spin keeps two reads in flight, SPIN_STAGGER
# cycles apart) under rs2_lean_pair in 7 of 7 pairs: ABBA 40.4 / 40.5 / 40.5 / 40.6 vs 40.9 / 41.6 / 41.9 / 41.4 us,
# sweep samples -2.4 / -1.2 / -3.4 % (40.3 vs 41.7; loop 265.2: 6.58x, fused step 119.9: 2.98x); stagger 300 40.1,
# 1000 43.0; block 7 21.9 vs 22.4, block 1 7.5 vs 7.9; its GPU tests passed.
GLUON_AUTO_RESIDENT_FORM = "rs2_lean_pair_pp"
GLUON_AUTO_RESIDENT_GEOMETRY = dict(tile_rows=128, resident_tiles=2, stream_rows=128)
GLUON_AUTO_RESIDENT_CHUNK_ROWS: tuple[int, ...] = (256,)
# Shards of 320..512 rows: a ~32k vocabulary on fewer SMs than 132 (H100 PCIe's 114: 320 rows a program in the Triton
# plan; H20's 78: 448; an MPS client at half an H200, whose properties report 66 SMs: 512). The Triton walk streams
# 3/4 of such a shard every step (the 4-stage ring form measured for 152k's 1,152 rows). Gluon's rs2 form with one
# resident tile and a 2-stage ring of 128-row tiles keeps 256 rows in registers and streams the rest from L2 (its
# plan: shards of 384 rows at P = 114, 512 at P = 78 / 66). Session 20, call 3 at 01e1a03 (H200, triton 3.6, P SMs
# emulated by head_walk(programs=P), which a real MPS client at 66 SMs matched within 1 %; CUDA-graph replays, us a
# 15-step walk, vLLM's W2 layout), this form vs the Triton walk's default: greedy b1 50.3 / 58.8 / 59.1 vs 79.4 / 94.6
# / 99.7 at P = 114 / 78 / 66, sampled b1 58.4 / 68.2 / 68.0 vs 104.2 / 128.8 / 140.7; on 132 SMs it ties auto's
# forms (39.5 vs 39.9). GLUON_AUTO_GEOMETRY's 384 resident rows do not fit beside a ring there (shared memory). Its
# 256 resident rows are both register tiles, so the form walks without its lean start (nothing to load by TMA, logged
# once): measured so.
GLUON_AUTO_FEW_SMS_FORM = "rs2_sf_lean_pp"
GLUON_AUTO_FEW_SMS_GEOMETRY = dict(stream_tma=2, tile_rows=128, resident_tiles=1, stream_rows=128)
GLUON_AUTO_FEW_SMS_CHUNK_ROWS: tuple[int, ...] = (320, 384, 448, 512)


def gluon_auto_plan(plan, geometry: dict) -> tuple[WalkConfig | None, str | None]:
    """(plan, None) of the Gluon walk gluon="auto" chose, in its geometry; (None, why) where that plan is refused: its
    128-row tiles round the shard up past the Triton plan's 64-row one, which can score row ids past MAX_TOKENS (a
    vocabulary within ~3k of 262,144 on some SM counts) -- the Triton walk then runs."""
    try:
        return plan(ring_reads_u=False, **geometry), None
    except ValueError as exc:
        return None, f"the Gluon walk's plan: {exc}"


def gluon_auto_form(cfg: WalkConfig) -> tuple[str, dict]:
    """(form, plan geometry) gluon="auto" walks for the Triton plan cfg: the resident form for fully resident shards
    of the measured size (GLUON_AUTO_RESIDENT_CHUNK_ROWS), the few-SMs form for shards of
    GLUON_AUTO_FEW_SMS_CHUNK_ROWS, else the streamed one (GLUON_AUTO_FORM, _GEOMETRY)."""
    if cfg.chunk_rows in GLUON_AUTO_RESIDENT_CHUNK_ROWS:
        return GLUON_AUTO_RESIDENT_FORM, GLUON_AUTO_RESIDENT_GEOMETRY
    if cfg.chunk_rows in GLUON_AUTO_FEW_SMS_CHUNK_ROWS:
        return GLUON_AUTO_FEW_SMS_FORM, GLUON_AUTO_FEW_SMS_GEOMETRY
    return GLUON_AUTO_FORM, GLUON_AUTO_GEOMETRY
# plan_walk's launch options at their defaults (head_walk's too): anything else is a caller's choice.
PLAN_DEFAULTS = dict(residency="auto", programs=None, lockstep=False, tile_rows=None, resident_tiles=None,
                     exchange="auto", num_warps=None, num_stages=None, stream_rows=None, keys_once=True,
                     prefetch=True, l1_prefetch=False, split_keys=None, pair_reduce=True, split_streamed=None,
                     noise_ahead=None, l2_prefetch=None, stream_tma=None, u_ring=True, winner_stride=WINNER_STRIDE,
                     noise_table=None)


def _why_not_gluon_here(triton_version: str, have_gluon: bool, capability: tuple[int, int] | None) -> str | None:
    """Why no Gluon kernel can run here (no Gluon, a Triton version the kernels were not checked on, no sm_90)."""
    version = ".".join(triton_version.split(".")[:2])
    if not have_gluon:
        return f"triton {triton_version} has no triton.experimental.gluon"
    if version not in gluon_b1.CHECKED_TRITON:
        return f"triton {triton_version}: the Gluon kernel was checked on {', '.join(gluon_b1.CHECKED_TRITON)} only"
    if capability is None:
        return "no CUDA device (Gluon does not run in the interpreter)"
    if tuple(capability) != (9, 0):
        return f"compute capability {capability[0]}.{capability[1]}: the kernel's wgmma needs sm_90"
    return None


def _why_not_gluon_operands(dtypes: tuple[torch.dtype, torch.dtype, torch.dtype], rank: int) -> str | None:
    """Why the Gluon walks cannot take these operands ((W1, W2 rows, base logits) dtypes, rank r)."""
    w1_dtype, w2_dtype, u_dtype = dtypes
    if w1_dtype != w2_dtype or w2_dtype not in (torch.bfloat16, torch.float16):
        return f"W1 / W2 must share a 2-byte dtype (bf16 / fp16), got {w1_dtype} / {w2_dtype}"
    if u_dtype not in (torch.float32, torch.float16, torch.bfloat16):
        return f"base logits dtype {u_dtype}"
    if rank != 256:
        return f"rank {rank}: the kernel was compiled and checked at r = 256 only"
    return None


def why_not_gluon_b1(cfg: WalkConfig, *, num_rows: int, head: str, sampled: bool, extras: bool,
                     dtypes: tuple[torch.dtype, torch.dtype, torch.dtype], rank: int,
                     capability: tuple[int, int] | None, rs: int = 0, w2_tma: bool = True, lean: bool = False,
                     d2t: bool = False, target_vocab: int = 0, cache: bool = False,
                     triton_version: str = triton.__version__, have_gluon: bool = gluon_b1.HAVE_GLUON) -> str | None:
    """None where gluon_b1's streamed walk walks this case exactly as the Triton walk would, else why not (the log
    line of the fallback). dtypes: (W1, W2 rows, base logits). extras: d2t not known to be increasing, a compact
    draft-logits cache, confidence, a token buffer not contiguous along the steps, or a sampled row's noise table
    over NOISE_TABLE_MAX_BYTES. A sampled row (its noise made before the walk) and a draft-logits cache (cache)
    are the Gluon walk's. w2_tma: W2's rows can be read by TMA. lean: a "..._lean" form (the only ones that walk
    fully resident shards, HW12). d2t: an increasing d2t (rows keyed by target id: fully resident shards only (and,
    at launch, a paired two-tile form), target ids below 2^18; target_vocab = W1's rows)."""
    reason = _why_not_gluon_here(triton_version, have_gluon, capability)
    if reason is None and (num_rows != 1 or head != "markov" or extras):
        reason = ("only one Markov row without confidence or a compact draft-logits cache (a d2t only where it "
                  "increases, a sampled row's noise table within NOISE_TABLE_MAX_BYTES) has a Gluon walk")
    if reason is None and d2t and not (lean and cfg.chunk_rows <= gluon_b1.MAX_SHARD_ROWS):
        reason = (f"a d2t with shards of {cfg.chunk_rows} rows: the Gluon walk keys rows by target id only in its "
                  f"fully resident forms")
    if reason is None and d2t and target_vocab > MAX_TOKENS:
        reason = f"a d2t into {target_vocab} target ids: the keys hold ids below {MAX_TOKENS}"
    if reason is not None:
        return reason
    reason = _why_not_gluon_operands(dtypes, rank)
    if reason is not None:
        return reason
    if not cfg.multi or cfg.exchange != "tagged":
        return f"plan {cfg.exchange!r} / multi={cfg.multi}: only the persistent tagged walk has a Gluon form"
    if cfg.chunk_rows <= gluon_b1.MAX_SHARD_ROWS and not lean:
        return (f"shards of {cfg.chunk_rows} rows stay on chip: the Gluon walk of resident shards measured no faster "
                f"(32k b1 45.8 vs 45.1 us, session 7) and was removed (code at eee43d2); the '..._lean' forms walk "
                f"them (HW12)")
    return _why_not_gluon_b1_stream(cfg, rs, w2_tma, sampled)


def _overrides_given(overrides: list[str]) -> str | None:
    """Why gluon="auto" leaves the walk to the Triton plan: launch options the caller set."""
    return f"launch options {', '.join(overrides)} given (they configure the Triton walk)" if overrides else None


def _triton_not_measured(triton_version: str, walk_name: str, ask: str) -> str | None:
    """Why gluon="auto" does not take a Gluon walk on this Triton: it was measured faster on gluon_b1.MEASURED_TRITON
    only (`ask`, the explicit form, still walks it)."""
    if ".".join(triton_version.split(".")[:2]) in gluon_b1.MEASURED_TRITON:
        return None
    return (f"triton {triton_version}: {walk_name} was measured faster on triton "
            f"{', '.join(gluon_b1.MEASURED_TRITON)} only ({ask} asks for it)")


def why_not_gluon_auto(cfg: WalkConfig, *, overrides: list[str], triton_version: str = triton.__version__,
                       **case) -> str | None:
    """None where head_walk(gluon="auto") takes a Gluon walk (gluon_auto_form's: the resident form, the few-SMs form
    or the streamed one) for the Triton walk's plan cfg: the shard sizes it was measured faster at (256; 320..512;
    1,152..3,776 rows; sampled rows and caches MEASURED_GLUON_DRAW_CHUNK_ROWS); else why the Triton walk runs
    (head_walk also refuses the Gluon plan itself where gluon_auto_plan says so). cfg: the Triton walk's default plan; overrides:
    the launch options the caller set (any: the Triton walk they name); case: why_not_gluon_b1's other
    arguments."""
    reason = (_overrides_given(overrides)
              or why_not_gluon_b1(cfg, triton_version=triton_version,
                                  lean=gluon_form_flags(gluon_auto_form(cfg)[0])["lean_ends"], **case)
              or _triton_not_measured(triton_version, "the Gluon walk", "gluon=True"))
    if reason is not None:
        return reason
    measured = sorted(GLUON_AUTO_RESIDENT_CHUNK_ROWS + GLUON_AUTO_FEW_SMS_CHUNK_ROWS)
    low, high = GLUON_AUTO_STREAMED_CHUNK_RANGE
    if cfg.chunk_rows not in measured and not low <= cfg.chunk_rows <= high:
        return (f"shards of {cfg.chunk_rows} rows: the Gluon walk was measured at {', '.join(map(str, measured))} and "
                f"{low}..{high} rows a program only (gluon=True asks for it)")
    if (case.get("sampled") or case.get("cache")) and cfg.chunk_rows not in MEASURED_GLUON_DRAW_CHUNK_ROWS:
        return (f"a {'sampled row' if case.get('sampled') else 'draft-logits cache'} with shards of {cfg.chunk_rows} "
                f"rows: the Gluon walk's draw was not measured faster there (an explicit gluon= form walks it)")
    return None


# Shard sizes (rows a program of the Triton plan) where gluon="auto" also takes one sampled row and / or a
# draft-logits cache (gluon_b1's SAMPLED / STORE_LOGITS, the noise made before the walk). Ladder v67 (session 17,
# H200, triton 3.6, ABBA x 2, us a 15-step sampled walk with its cache incl. the noise table's launch, Gluon vs the
# Triton walk's default): 32k (256 rows) 44.7 / 44.7 vs 54.7 / 54.7; 32k with a d2t into 151,936 ids 45.3 / 46.1 vs
# 52.4 / 53.0; 152k (1,152 rows) 246.2 / 242.8 vs 336.7 / 340.7. Greedy rows with a cache (no noise) walk the same
# code without the draw's noise: not timed apart.
# 248,320 (1,920 rows): ladder v72 (session 19; GLUON_AUTO_STREAMED_CHUNK_RANGE's comment). 320..512 rows (fewer SMs): session
# 20 (GLUON_AUTO_FEW_SMS_CHUNK_ROWS' comment).
# 152k on fewer SMs (sampled with its cache, session 20): Triton shards of 1,344 / 1,984 rows (P = 114 / 78, call 5 at
# 7602a8a) 279.5 / 317.1 vs the Triton walk's 345.0 / 457.9, 1,536 / 1,728 (P = 100 / 90, call 7 at 9b8dc40) 297.9 /
# 302.6 vs 378.5 / 410.1: every 64-row shard size from 1,152 to 1,984 (past ~2,048 the draw's noise does not fit beside
# the ring: why_not_gluon_b1 keeps the Triton walk).
MEASURED_GLUON_DRAW_CHUNK_ROWS: tuple[int, ...] = (256, 320, 384, 448, 512) + tuple(range(1152, 1985, 64))


# The streamed Gluon walk's shared memory: resident rows + ring slots of 32 KB (64-row tiles) or 64 KB (128) (+ ~12 KB
# of operand / keys / base logits) must stay under the H200's 227 KiB: 128 resident rows with 4 stages of 64 rows is
# the Triton default's geometry.
GLUON_STREAM_SMEM = 215 * 1024


def _gluon_stream_form(cfg: WalkConfig, rs: int = 0) -> tuple[int, int, int]:
    """(resident rows, streamed tiles, ring stages) of gluon_b1's streamed walk: the plan's TMA ring where it has
    one, else the measured b1 ring form (choose_streamed_tma(1)): the Gluon walk loads base logits by pointer, so a
    vocabulary whose U rows are not 16-byte aligned (no Triton ring) still streams W2 through its ring. A fully
    resident shard (the "..._lean" forms): all its rows resident, no streamed tile, a ring of 1 stage never filled."""
    if cfg.chunk_rows <= gluon_b1.MAX_SHARD_ROWS:
        return cfg.chunk_rows, 0, 1
    if cfg.stream_tma >= 2:
        # rs = 2: the second register tile adds its rows to the plan's (whose residency counts shared memory only).
        resident, stages = cfg.tile_rows * cfg.resident_tiles + max(0, rs - 1) * cfg.stream_rows, cfg.stream_tma
    else:
        stages, tile_rows, tiles, _ = choose_streamed_tma(1)
        resident = min(tile_rows * tiles, cfg.chunk_rows - cfg.stream_rows)
    return resident, (cfg.chunk_rows - resident) // cfg.stream_rows, stages


def _why_not_gluon_b1_stream(cfg: WalkConfig, rs: int, w2_tma: bool, sampled: bool = False) -> str | None:
    """Partly streamed shards (V = 152k), or fully resident ones in a "..._lean" form (32k): gluon_b1's
    head_walk_b1_stream_kernel (_gluon_stream_form's geometry, tiles of gluon_b1.STREAM_TILE_ROWS rows); None where it
    can walk, else why not."""
    if not w2_tma:
        return (f"shards of {cfg.chunk_rows} rows: W2's rows cannot be read by TMA (16-byte aligned start and rows "
                f"needed)")
    resident, tiles, stages = _gluon_stream_form(cfg, rs)
    if cfg.stream_tma == 1 and tiles:
        return "a ring of 1 stage: the Gluon streamed walk needs >= 2"
    if cfg.stream_rows not in gluon_b1.STREAM_TILE_ROWS or resident % cfg.stream_rows:
        return (f"streamed tiles of {cfg.stream_rows} rows, {resident} resident: the Gluon streamed walk was built "
                f"for {' / '.join(map(str, gluon_b1.STREAM_TILE_ROWS))}-row tiles and resident rows in whole tiles")
    # 'rs' holds the first resident tile (rs2: the first two) in registers, not in shared memory (a fully resident
    # shard stages them there: its register tiles come by TMA).
    smem = (resident - (cfg.stream_rows * rs if tiles else 0) + stages * cfg.stream_rows) * 256 * 2 + 12 * 1024
    if sampled:  # the step's noise beside its base logits, fp32
        smem += triton.next_power_of_2(triton.cdiv(cfg.chunk_rows, cfg.stream_rows)) * cfg.stream_rows * 4
    if smem > GLUON_STREAM_SMEM:
        return f"{resident} resident rows + {stages} ring stages need {smem} B of shared memory (> {GLUON_STREAM_SMEM})"
    if cfg.programs > gluon_b1.STREAM_CANDS * 32:
        return f"{cfg.programs} programs: the streamed walk polls at most {gluon_b1.STREAM_CANDS * 32}"
    if rs and resident < cfg.stream_rows * rs:
        return (f"gluon='rs{'2' if rs == 2 else ''}' needs {rs} resident tile(s) of {cfg.stream_rows} rows to hold in "
                f"registers, got {resident} rows")
    if rs == 2 and cfg.stream_rows != 128:
        return "gluon='rs2...' was built for 128-row tiles (8 warps)"
    return None


_gluon_failed: dict = {}


def _launch_gluon_b1(cfg: WalkConfig, u, w1, w2_rows, first, tokens, logit_scale: float, rs: int,
                     stream_first: bool = False, lean_ends: bool = False, paired: bool = False,
                     pipelined_spin: bool = False, d2t: torch.Tensor | None = None,
                     draw: dict | None = None) -> bool:
    """One launch of gluon_b1's streamed walk (why_not_gluon_b1 said yes: partly resident shards, TMA ring kept
    across the steps; stream_first / lean_ends: gluon_form_flags); False (logged, remembered per build) where it
    does not compile, so the caller walks the Triton kernel. draw: the row's request and sampling (head_walk's
    req_indices, temperature, seeds, positions: None for a greedy walk) and draft_logits (None: no cache); a
    sampled walk's noise is made before it (_noise_table), since the Gluon walk loads it."""
    rank = w1.shape[1]
    wsp = _workspace(u.device, cfg.programs, cfg.block_rows, rank, family="gluon",
                     layout=walk_layout("gluon", u.shape[0], u.shape[1]))
    resident, tiles, stages = _gluon_stream_form(cfg, rs)
    st = cfg.stream_rows
    # Fully resident shards load their register tiles by TMA too (through shared memory: no ring shares it).
    rs_tma = bool(lean_ends and rs and not tiles)
    if lean_ends and resident <= st * rs and not rs_tma:
        log_once(logger, logging.INFO, f"head_walk(gluon): no resident tile in shared memory ({resident} resident "
                 f"rows): the lean start has nothing to load by TMA; walking without it")
        lean_ends = False
    # PAIRED: two resident tiles and no streamed one (the selection's "..._pair" rule); otherwise off.
    paired = paired and tiles == 0 and resident == 2 * st
    if d2t is not None and not paired:
        log_once(logger, logging.INFO, "head_walk(gluon): a d2t needs a '..._pair' form of a fully resident shard "
                 "(rows keyed by target id); walking the Triton kernel")
        return False
    stagger = SPIN_STAGGER if pipelined_spin else 0
    key = (cfg, rs, stream_first, lean_ends, paired, rs_tma, stagger, SPIN_READS, d2t is not None, u.dtype, w1.dtype,
           rank, *_gluon_draw_key(draw))
    if key in _gluon_failed:
        return False
    draw_args, draw_flags = _gluon_draw(draw, u, d2t, first, wsp["count"])
    try:
        w2_desc = gluon_b1.stream_descriptor(w2_rows, st)
        _launch_walk(
            gluon_b1.head_walk_b1_stream_kernel, cfg.programs, u.device,
            u, u.stride(1), w1, w1.stride(0), w2_rows, w2_rows.stride(1), w2_rows.stride(0), w2_desc, first, tokens,
            wsp["keys"], wsp["gen"], wsp["err"], u.shape[1], u.shape[2], float(logit_scale),
            d2t if d2t is not None else first, *draw_args,
            R=rank, ST=st, RES_ROWS=resident, STREAM_TILES=tiles,
            TILES_P2=triton.next_power_of_2(triton.cdiv(cfg.chunk_rows, st)), STAGES=stages,
            CHUNK_ROWS=cfg.chunk_rows, NUM_PROGS=cfg.programs, KEY_STRIDE=cfg.block_rows,
            SLOTS_PER_CAND=max(1, triton.next_power_of_2(triton.cdiv(cfg.programs, gluon_b1.STREAM_CANDS))),
            RS_ROWS=st * rs, SCALED=float(logit_scale) != 1.0, SPIN_LIMIT=SPIN_LIMIT,
            GUESS_ROUNDS=GUESS_ROUNDS, STREAM_FIRST=stream_first, LEAN_ENDS=lean_ends, PAIRED=paired, RS_TMA=rs_tma,
            SPIN_STAGGER=stagger, SPIN_READS=SPIN_READS, HAS_D2T=d2t is not None, **draw_flags,
            num_warps=gluon_b1.stream_warps(st))
    except CooperativeLaunchRefused:
        raise
    except Exception as exc:  # a build this Triton rejects: the Triton walk takes over
        _gluon_failed[key] = f"{type(exc).__name__}: {str(exc)[:200]}"
        form = (("rs2" if rs == 2 else "rs" if rs else "ss") + ("_sf" if stream_first else "")
                + ("_lean" if lean_ends else "") + ("_pair" if paired else "") + ("_pp" if stagger else ""))
        log_once(logger, logging.WARNING, f"head_walk(gluon): the Gluon build failed ({form}, {resident} resident "
                 f"rows, {stages} ring stages: {_gluon_failed[key]}); walking the Triton kernel")
        return False
    return True


def _gluon_draw_parts(draw: dict | None):
    """(temperature, cache, requests) of a Gluon walk's draw: draw holds head_walk's req_indices, temperature, seeds,
    positions (None: greedy) and draft_logits (None: no cache); a greedy walk without a cache reads no request (None),
    so its build is the greedy one."""
    draw = draw or {}
    temperature, cache = draw.get("temperature"), draw.get("draft_logits")
    return temperature, cache, draw.get("req_indices") if temperature is not None or cache is not None else None


def _gluon_draw_key(draw: dict | None) -> tuple:
    """The part of a Gluon build's key its draw decides (sampled, cache, requests, the cache's dtype)."""
    temperature, cache, req = _gluon_draw_parts(draw)
    return temperature is not None, cache is not None, req is not None, cache.dtype if cache is not None else None


def _gluon_draw(draw: dict | None, u, d2t, first, dummy) -> tuple[tuple, dict]:
    """The draw arguments of a Gluon walk's launch (gluon_b1's and gluon_rows' kernels take the same): requests,
    temperatures, the noise table with its step and row strides, the cache with its request and step strides
    (placeholders where unused), and SAMPLED / STORE_LOGITS / HAS_REQ. A sampled walk's noise table is made here,
    before the walk that loads it."""
    temperature, cache, req = _gluon_draw_parts(draw)
    sampled, store = temperature is not None, cache is not None
    table = None
    if sampled:
        table = _noise_table(u.shape[0], u.shape[1], u.shape[2], req, temperature, draw["seeds"],
                             draw["positions"].contiguous(), d2t, dummy)
    args = (req if req is not None else first, temperature if sampled else first, table if sampled else u,
            table.stride(0) if sampled else 0, table.stride(1) if sampled else 0, cache if store else u,
            cache.stride(0) if store else 0, cache.stride(1) if store else 0)
    return args, dict(SAMPLED=sampled, STORE_LOGITS=store, HAS_REQ=req is not None)


def why_not_gluon_rows(cfg: WalkConfig, *, num_rows: int, head: str, sampled: bool, extras: bool,
                       dtypes: tuple[torch.dtype, torch.dtype, torch.dtype], rank: int,
                       capability: tuple[int, int] | None, w2_tma: bool = True, d2t: bool = False,
                       cache: bool = False, triton_version: str = triton.__version__,
                       have_gluon: bool = gluon_b1.HAVE_GLUON) -> str | None:
    """None where gluon_rows' walk (head_walk(gluon="rows")) walks this case exactly as the Triton walk would, else
    why not (the log line of the fallback): 2..32 Markov rows, greedy or sampled (their noise made before the walk),
    without confidence or a compact draft-logits cache (extras; a d2t only where it increases: d2t, rows keyed by
    target id), fully resident shards of at most 256 rows (W2 rows readable by TMA), the persistent plan. cache: a
    draft-logits cache the walk stores."""
    reason = _why_not_gluon_here(triton_version, have_gluon, capability)
    if reason is None and not (2 <= num_rows <= gluon_rows.MAX_ROWS and head == "markov" and not extras):
        reason = (f"only 2..{gluon_rows.MAX_ROWS} Markov rows without confidence or a compact draft-logits cache (and "
                  f"a d2t only where it increases) have the Gluon rows walk (got {num_rows} "
                  f"{'sampled' if sampled else 'greedy'} {head} rows{', extras' if extras else ''})")
    reason = reason or _why_not_gluon_operands(dtypes, rank)
    if reason is not None:
        return reason
    if not cfg.multi:
        return "plan multi=False: only the persistent walk has a Gluon form"
    if cfg.chunk_rows > gluon_rows.MAX_SHARD_ROWS:
        return (f"shards of {cfg.chunk_rows} rows: the Gluon rows walk keeps whole shards of at most "
                f"{gluon_rows.MAX_SHARD_ROWS} rows on chip")
    if cfg.programs > gluon_rows.MAX_PROGRAMS:
        return f"{cfg.programs} programs: the rows walk polls at most {gluon_rows.MAX_PROGRAMS}"
    if not w2_tma:
        return "W2's rows cannot be read by TMA (16-byte aligned start and rows needed)"
    if cfg.programs < num_rows:
        return f"{num_rows} rows on {cfg.programs} programs: the rows walk's inbox exchange needs a program a row"
    if cfg.block_rows < gluon_rows.rows_n(num_rows):
        return f"key slots of {cfg.block_rows} columns for {gluon_rows.rows_n(num_rows)} rows"
    return None


# gluon_rows' exchange (its kernel's EXCHANGE): "inbox" (each batch row reduced by one program, which stores the
# winner into every program's inbox); "local" is the bench's diagnostic (no exchange, wrong tokens). (Session 12's
# "all", every program polling every program's keys of every row, measured 2.6x slower than the Triton walk at 32k
# b32, ladder v48, by the polls' L2 traffic: removed, code at 4d416ad.)
ROWS_EXCHANGE = "inbox"
ROWS_EXCHANGE_CODES = {"inbox": 1, "local": 2}
# The rows walk's spins: one read of a slot at a time (ladder v49, 32k b32: 90.9 us against 106.3 / 106.8 with the
# "..._pp" spin's two reads in flight, SPIN_STAGGER cycles apart: every lane of a warp polls the same inbox slot).
ROWS_SPIN_STAGGER = 0
# The rows walk's warps (gluon_rows.NUM_WARPS; its tiles are 16 rows a warp: 8 warps, two tiles of 128 rows).
ROWS_WARPS = gluon_rows.NUM_WARPS


# gluon="auto" takes the rows walk for 2..GLUON_AUTO_ROWS_MAX greedy rows of fully resident 256-row shards (V = 32k
# class), as measured (ladder v50, H200, triton 3.6, 32k block 15, ABBA x 2, us per walk, Triton walk vs rows with the
# inbox exchange and plain spins): b2 59.8 / 59.9 vs 55.6 / 55.9, b4 60.1 / 60.1 vs 56.0 / 56.1, b8 60.8 / 60.8 vs
# 57.6 / 57.3 (-5.5..-7 % in all 6 pairs); b16 64.1 / 64.2 vs 71.8 / 69.7 and b32 84.8 / 85.0 vs 90.4 / 90.0 slower.
GLUON_AUTO_ROWS_MAX = 8


def why_not_gluon_rows_auto(cfg: WalkConfig, *, overrides: list[str], triton_version: str = triton.__version__,
                            **case) -> str | None:
    """None where head_walk(gluon="auto") walks several rows in gluon_rows' walk (the case it was measured faster
    in: 2..GLUON_AUTO_ROWS_MAX rows, shards of GLUON_AUTO_RESIDENT_CHUNK_ROWS, triton of gluon_b1.MEASURED_TRITON, no
    launch option given); else why the Triton walk runs. case: why_not_gluon_rows' other arguments."""
    reason = (_overrides_given(overrides) or why_not_gluon_rows(cfg, triton_version=triton_version, **case)
              or _triton_not_measured(triton_version, "the Gluon rows walk", "gluon='rows'"))
    if reason is not None:
        return reason
    if case["num_rows"] > GLUON_AUTO_ROWS_MAX:
        return (f"{case['num_rows']} rows: the Gluon rows walk was measured faster at 2..{GLUON_AUTO_ROWS_MAX} rows "
                f"only (slower at 16 / 32, ladder v50; gluon='rows' asks for it)")
    if cfg.chunk_rows not in GLUON_AUTO_RESIDENT_CHUNK_ROWS:
        return (f"shards of {cfg.chunk_rows} rows: the Gluon rows walk was measured at "
                f"{', '.join(map(str, GLUON_AUTO_RESIDENT_CHUNK_ROWS))} rows a program only (gluon='rows' asks for it)")
    most = MEASURED_GLUON_ROWS_D2T_DRAW_MAX if case.get("d2t") else MEASURED_GLUON_ROWS_DRAW_MAX
    if (case.get("sampled") or case.get("cache")) and case["num_rows"] > most:
        return (f"{case['num_rows']} {'sampled rows' if case.get('sampled') else 'rows with a draft-logits cache'}"
                f"{' with a d2t' if case.get('d2t') else ''}: the Gluon rows walk's draw was measured faster at "
                f"2..{most} rows only (gluon='rows' asks for it)")
    return None


# gluon="auto" walks sampled rows and / or a draft-logits cache in gluon_rows' walk (its noise made before it) up to
# this many rows; with a d2t (the cache's target-id columns) up to the second. Ladders v68 / v69 (session 17, H200,
# triton 3.6, 32k block 15, ABBA x 2, us incl. the noise table's launch, rows vs the Triton walk's sampled default):
# b2 63.8 / 63.9 vs 73.7 / 73.6, b4 67.9 / 67.8 vs 78.0 / 78.0, b8 83.4 / 83.9 vs 93.4 / 93.6 (v69: 83.3 / 83.6 vs
# 91.3 / 90.5); d2t b4 73.5 / 74.4 vs 85.7 / 87.6, d2t b8 120.1 / 120.3 vs 107.5 / 107.9 (v69: 117.2 / 120.0 vs 107.7 /
# 107.7; without the cache 78.2 / 78.2 vs 87.1 / 87.0: the rows walk's store of 8 columns into target-id columns is
# what loses). Ladder v70: d2t b2 65.1 / 64.5 vs 78.8 / 79.1.
MEASURED_GLUON_ROWS_DRAW_MAX = 8
MEASURED_GLUON_ROWS_D2T_DRAW_MAX = 4


def _launch_gluon_rows(cfg: WalkConfig, u, w1, w2_rows, first, tokens, logit_scale: float,
                       d2t: torch.Tensor | None = None, draw: dict | None = None) -> bool:
    """One launch of gluon_rows' walk (why_not_gluon_rows said yes); False (logged, remembered per build) where it
    does not compile, so the caller walks the Triton kernel. draw: as _launch_gluon_b1's (the rows' requests and
    sampling, the draft-logits cache; a sampled walk's noise made before it)."""
    rank = w1.shape[1]
    wsp = _workspace(u.device, cfg.programs, cfg.block_rows, rank, family="gluon",
                     layout=walk_layout("gluon", u.shape[0], u.shape[1]))
    bn = gluon_rows.rows_n(u.shape[0])
    tile_rows = 16 * ROWS_WARPS
    res_t = triton.cdiv(cfg.chunk_rows, tile_rows)
    key = ("rows", cfg, bn, res_t, ROWS_WARPS, ROWS_EXCHANGE, ROWS_SPIN_STAGGER, SPIN_READS, d2t is not None, u.dtype,
           w1.dtype, rank, *_gluon_draw_key(draw))
    if key in _gluon_failed:
        return False
    draw_args, draw_flags = _gluon_draw(draw, u, d2t, first, wsp["count"])
    try:
        w2_desc = gluon_b1.stream_descriptor(w2_rows, tile_rows)
        _launch_walk(
            gluon_rows.head_walk_rows_kernel, cfg.programs, u.device,
            u, u.stride(0), u.stride(1), w1, w1.stride(0), w2_desc, first, tokens, tokens.stride(0),
            wsp["keys"], wsp["inbox"], wsp["gen"], wsp["err"], u.shape[0], u.shape[1], u.shape[2],
            float(logit_scale), d2t if d2t is not None else first, *draw_args,
            R=rank, RES_T=res_t, CHUNK_ROWS=cfg.chunk_rows,
            NUM_PROGS=cfg.programs, KEY_STRIDE=cfg.block_rows,
            BN=bn, PP=max(32, triton.next_power_of_2(cfg.programs)), SCALED=float(logit_scale) != 1.0,
            SPIN_LIMIT=SPIN_LIMIT, EXCHANGE=ROWS_EXCHANGE_CODES[ROWS_EXCHANGE],
            SPIN_STAGGER=ROWS_SPIN_STAGGER, SPIN_READS=SPIN_READS, HAS_D2T=d2t is not None, **draw_flags,
            num_warps=ROWS_WARPS)
    except CooperativeLaunchRefused:
        raise
    except Exception as exc:  # a build this Triton rejects: the Triton walk takes over
        _gluon_failed[key] = f"{type(exc).__name__}: {str(exc)[:200]}"
        log_once(logger, logging.WARNING, f"head_walk(gluon='rows'): the Gluon build failed ({bn} columns, {res_t} "
                 f"resident tiles: {_gluon_failed[key]}); walking the Triton kernel")
        return False
    return True


def _tma_ok(t: torch.Tensor) -> bool:
    """A tensor descriptor (TMA) can address t: contiguous last dim, 16-byte aligned start and row strides."""
    size = t.element_size()
    return (t.stride(-1) == 1 and t.data_ptr() % 16 == 0
            and all(stride * size % 16 == 0 for stride in t.stride()[:-1]))


def _stream_descriptors(cfg: WalkConfig, u: torch.Tensor, w2_rows: torch.Tensor):
    """(W2 [V, r] in [ST, r] tiles, U in [1, ST] tiles of U[0] as [N, V] for one row (at least 128 bytes wide:
    kernel._load_u_desc), else [BP, 1, ST] tiles of [B, N, V]) for STREAM_TMA; (None, None) when the streamed
    tiles take the register path."""
    if not cfg.stream_tma:
        return None, None
    st = cfg.stream_rows
    w2_desc = TensorDescriptor(w2_rows, list(w2_rows.shape), list(w2_rows.stride()), [st, w2_rows.shape[1]])
    if u.shape[0] == 1:
        u0 = u[0]
        u_desc = TensorDescriptor(u0, list(u0.shape), list(u0.stride()), [1, max(st, U_BOX_BYTES // u.element_size())])
    else:
        u_desc = TensorDescriptor(u, list(u.shape), list(u.stride()), [cfg.block_rows, 1, st])
    return w2_desc, u_desc


def _launch(cfg: WalkConfig, u, w1, w2_rows, w2_scale, first, tokens, req, temperature, seeds, positions, d2t,
            draft_logits, conf_h, conf_w, confidence, gh, t1, hj, t3, ws, head: int, logit_scale: float,
            compact_logits: bool = False, d2t_increasing: bool = False) -> None:
    num_rows, num_steps, vocab = u.shape
    rank = w1.shape[1]
    block_rows = cfg.block_rows
    wsp = _workspace(u.device, cfg.programs, block_rows, rank,
                     layout=walk_layout("triton", num_rows, num_steps, cfg.exchange in TAGGED_EXCHANGES))
    # State dims a program advances at a time: its whole share with grid barriers, else 16 at a time (a
    # [r, r] weight block per dot would not fit in shared memory).
    state_slice = max(16, triton.next_power_of_2(triton.cdiv(rank, cfg.programs))) if cfg.multi else 16
    dummy = wsp["count"]
    winners, arrive = _winner_slots(wsp, cfg.winner_stride) if cfg.exchange == "amax" else (None, None)
    w2_desc, u_desc = _stream_descriptors(cfg, u, w2_rows)
    pos = positions.contiguous() if positions is not None else None
    table = None
    if choose_noise_table(cfg, num_rows, num_steps, vocab, temperature is not None):
        table = _noise_table(num_rows, num_steps, vocab, req, temperature, seeds, pos, d2t, dummy)
    args = dict(
        u_ptr=u, stride_ub=u.stride(0), stride_uk=u.stride(1),
        w1_ptr=w1, stride_w1=w1.stride(0),
        w2_ptr=w2_rows, stride_w2r=w2_rows.stride(1), stride_w2v=w2_rows.stride(0),
        w2_scale_ptr=w2_scale if w2_scale is not None else dummy,
        first_ptr=first, tok_ptr=tokens, stride_tb=tokens.stride(0),
        req_ptr=req if req is not None else dummy,
        temp_ptr=temperature if temperature is not None else dummy,
        seed_ptr=seeds if seeds is not None else dummy,
        pos_ptr=pos if pos is not None else dummy, stride_pb=pos.stride(0) if pos is not None else 0,
        d2t_ptr=d2t if d2t is not None else dummy,
        dl_ptr=draft_logits if draft_logits is not None else u,
        stride_dlr=draft_logits.stride(0) if draft_logits is not None else 0,
        stride_dlk=draft_logits.stride(1) if draft_logits is not None else 0,
        conf_h_ptr=conf_h if conf_h is not None else dummy, conf_w_ptr=conf_w if conf_w is not None else dummy,
        conf_ptr=confidence if confidence is not None else dummy,
        gh_ptr=gh if gh is not None else dummy, t1_ptr=t1 if t1 is not None else w1,
        stride_t1=t1.stride(0) if t1 is not None else 0,
        hj_ptr=hj if hj is not None else dummy, t3_ptr=t3 if t3 is not None else w1,
        stride_t3=t3.stride(0) if t3 is not None else 0, ws_ptr=ws if ws is not None else dummy,
        sb_ptr=wsp["state"], ob_ptr=wsp["out"],
        keys_ptr=wsp["keys"], count_ptr=wsp["count"], gen_ptr=wsp["gen"], err_ptr=wsp["err"],
        w2_desc=w2_desc, u_desc=u_desc,
        win_ptr=winners, arrive_ptr=arrive,
        num_rows=num_rows, num_steps=num_steps, vocab=vocab, logit_scale=float(logit_scale),
        R=rank, BP=block_rows, RT=cfg.tile_rows, RES_TILES=cfg.resident_tiles, ST=cfg.stream_rows,
        CHUNK_ROWS=cfg.chunk_rows,
        NUM_PROGS=cfg.programs, PP=triton.next_power_of_2(cfg.programs), HEAD=head,
        SAMPLED=temperature is not None, HAS_REQ=req is not None, HAS_D2T=d2t is not None,
        STORE_LOGITS=2 if compact_logits else draft_logits is not None, HAS_CONF=conf_h is not None, W2_SCALED=w2_scale is not None,
        MULTI=cfg.multi, SJ=state_slice, SPIN_LIMIT=SPIN_LIMIT,
        DOT_PRECISION="ieee" if w2_rows.dtype == torch.float32 else "tf32",
        EXCHANGE=EXCHANGE_CODES[cfg.exchange], KEYS_ONCE=cfg.keys_once, KB=1 if num_rows == 1 else block_rows,
        PREFETCH=cfg.prefetch, L1_PREFETCH=cfg.l1_prefetch,
        SCALED=float(logit_scale) != 1.0, SPLIT_KEYS=cfg.split_keys, PAIR_REDUCE=cfg.pair_reduce,
        SPLIT_STREAMED=cfg.split_streamed, NOISE_AHEAD_OPT=cfg.noise_ahead, L2_PREFETCH=cfg.l2_prefetch,
        L2_BULK=not _interpreting(), STREAM_TMA=cfg.stream_tma, U_RING=cfg.u_ring,
        WIN_STRIDE=cfg.winner_stride, INLINE_PTX=not _interpreting(), D2T_INCREASING=d2t_increasing,
        D2T_HOIST=D2T_HOIST if D2T_HOIST is not None else (
            temperature is None or num_rows >= D2T_HOIST_SAMPLED_MIN_ROWS),
        # (None without a table: constexpr, so the walk's parameters are those of a build without the option)
        nt_ptr=table, stride_ntk=table.stride(0) if table is not None else None,
        stride_ntb=table.stride(1) if table is not None else None,
        NOISE_TABLE=table is not None,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )
    grid = (cfg.programs,)
    # A build that needs more shared memory than the SM has drops TMA ring stages (down to 2), then the streamed
    # tiles' register pipelining, then resident
    # tiles (their rows are then streamed), until it fits; the choice is remembered for the next walk.
    key = (cfg, head, args["SAMPLED"], args["STORE_LOGITS"], args["HAS_CONF"], args["W2_SCALED"], u.dtype,
           table is not None)
    while True:
        cfg = _shrunk.get(key, cfg)
        args.update(RES_TILES=cfg.resident_tiles, num_stages=cfg.num_stages, STREAM_TMA=cfg.stream_tma)
        try:
            _run(cfg, grid, args, num_steps)
            return
        except OutOfResources:
            if cfg.stream_tma > 2:
                _shrunk[key] = replace(cfg, stream_tma=cfg.stream_tma - 1)
            elif cfg.num_stages > 1:
                _shrunk[key] = replace(cfg, num_stages=1)
            elif cfg.resident_tiles > 0:
                _shrunk[key] = replace(cfg, resident_tiles=cfg.resident_tiles - 1)
            else:
                raise


_shrunk: dict = {}


def _noise_table(num_rows: int, num_steps: int, vocab: int, req, temperature, seeds, positions, d2t,
                 dummy: torch.Tensor) -> torch.Tensor:
    """[N, B, V] fp32: every step's Gumbel noise of every sampled row (noise_table_kernel), made before the walk that
    loads it; positions contiguous [B, N]; dummy: any tensor on the device (for the absent req / d2t)."""
    table = torch.empty(num_steps, num_rows, vocab, dtype=torch.float32, device=positions.device)
    noise_table_kernel[(triton.cdiv(vocab, NOISE_TABLE_BLOCK), num_rows, num_steps)](
        table, table.stride(0), table.stride(1), req if req is not None else dummy, temperature, seeds, positions,
        positions.stride(0), d2t if d2t is not None else dummy, vocab, num_steps, HAS_REQ=req is not None,
        HAS_D2T=d2t is not None, BLOCK=NOISE_TABLE_BLOCK, num_warps=4)
    return table


def _run(cfg: WalkConfig, grid, args: dict, num_steps: int) -> None:
    device = args["u_ptr"].device
    if cfg.lockstep:
        for k in range(num_steps + 1):
            _launch_walk(head_walk_kernel, grid[0], device, k_begin=k, k_end=min(k + 1, num_steps), DO_FINAL=False,
                         coresident=False, **args)
    else:
        _launch_walk(head_walk_kernel, grid[0], device, k_begin=0, k_end=num_steps, DO_FINAL=True, **args)
