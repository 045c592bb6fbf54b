"""CPU tests of design C, the persistent forward (lab/attention/fa3_persistent.py). Not collected
by CI (pyproject's testpaths are tests/ and docs/): run ``pytest lab/attention`` from the
repository root. There is deliberately no GPU test: a wrong barrier phase would hang the suite;
``python -m benchmarks --lab attention designs`` probes the kernel in a child process with a time
limit instead.

Besides the refusals and the offline compile, ``test_schedule_model_*`` runs a model of the
kernel's barrier protocol: the producer's and both consumers' waits and arrivals, transcribed
from the kernel with the same running counters and parities, on mbarriers modelled as a phase
count (a wait for parity P passes while the completed-phase count's parity differs from P) and
TMA loads that land at random later times. Random interleavings must finish (no deadlock) and
every read must find the tile it expects in its slot (no phase aliasing, no overwrite in use).
It checks the protocol, not the Gluon code: keep the two in step when either changes.
"""

from __future__ import annotations

import random

import pytest
import torch

from tests._offline import compiled_offline


def fa3p():
    from lab.attention import fa3_persistent

    return fa3_persistent


def test_refusals_name_the_argument():
    """The tensor and scalar refusals are hopper.check_inputs' (tested with fa3_forward); here
    that they name this function, and the config refusals that are this design's own."""
    m = fa3p()
    good = torch.zeros(1, 2, 256, 128, dtype=torch.bfloat16)
    odd = torch.zeros(1, 2, 384, 128, dtype=torch.bfloat16)  # 3 tiles of 128 rows, not 2 x 128
    cases = [
        ((good.float(),) * 3, {}, ValueError, r"q has dtype .*fa3_persistent_forward takes"),
        ((torch.zeros(1, 2, 200, 128, dtype=torch.bfloat16),) * 3, {}, ValueError,
         r"N=200: fa3_persistent_forward needs"),
        ((good, good, good), dict(causal=1), TypeError, r"causal must be a bool"),
        ((good, good, good), dict(config=(64, 128, 2, True)), TypeError,
         r"config must be a fa3_persistent.Config"),
        ((odd, odd, odd), dict(config=m.Config(128, 128, 2, True)), ValueError,
         r"2 \* block_m=256, got N=384"),
        ((good, good, good), dict(config=m.Config(64, 128, 3, True)), ValueError,
         r"bytes of shared memory at D=128"),
        ((good, good, good), {}, ValueError, r"q is on cpu: fa3_persistent_forward needs CUDA"),
    ]
    for args, kw, exc, msg in cases:
        with pytest.raises(exc, match=msg):
            m.fa3_persistent_forward(*args, **kw)


def test_configs_fit_shared_memory_at_both_head_dims():
    from kernelnotes.attention.hopper import HEAD_DIMS

    m = fa3p()
    for cfg in m.CONFIGS:
        for d in HEAD_DIMS:
            assert cfg.shared_bytes(d) <= m.MAX_SHARED_BYTES, (cfg, d)
    assert m.Config(64, 128, 2, True).shared_bytes(128) == 192 * 1024
    assert m.Config(64, 128, 3, True).shared_bytes(128) > m.MAX_SHARED_BYTES


def test_compiles_for_sm90_without_spills():
    """Every config x D x causal through lab/attention/aot_check.py --persistent's compiler:
    12 warps, setmaxnreg 240 / 24, shared memory within a block's, no spills. Asserted with
    Triton 3.6 (the GPU machine's); with another Triton only that the module imports."""
    code = r"""
import json, triton
from lab.attention import aot_check
rows = aot_check.check_persistent() if triton.__version__.startswith("3.6") else []
print(json.dumps(dict(version=triton.__version__, rows=rows)))
"""
    got = compiled_offline(code)
    if not got["version"].startswith("3.6"):
        assert fa3p().CONFIGS  # the import is the check
        return
    m = fa3p()
    assert len(got["rows"]) == len(m.CONFIGS) * 2 * 2
    for row in got["rows"]:
        assert row["ok"], row
        assert row["warps"] == 12 and {240, 24} <= set(row["setmaxnreg"]), row
        assert row["shared"] <= m.MAX_SHARED_BYTES, row
        assert row["spill_stores"] == 0 and row["spill_loads"] == 0, row


# ------------------------------------------------------------------ the barrier protocol model
class _Bar:
    """An mbarrier: `count` arrivals (plus any expected TMA bytes, modelled as one pending load
    each) complete a phase."""

    def __init__(self, count):
        self.count, self.pending, self.phases = count, count, 0

    def arrive(self):
        self.pending -= 1
        assert self.pending >= 0
        if self.pending == 0:
            self.phases += 1
            self.pending = self.count

    def passes(self, parity):
        return (self.phases & 1) != parity


def _key_tiles(row0, N, bm, bn, causal):
    n_tiles = N // bn
    if causal:
        return min((row0 + 1) // bn, n_tiles), min(-(-(row0 + bm) // bn), n_tiles)
    return n_tiles, n_tiles


def _tile_coords(t, n_m, n_bh, lpt, causal):
    pid_m, pid_bh = t % n_m, t // n_m
    if causal:
        group, rank = t // (lpt * n_m), t % (lpt * n_m)
        heads = min(lpt, n_bh - group * lpt)
        pid_m, pid_bh = n_m - 1 - rank // heads, group * lpt + rank % heads
    return pid_m, pid_bh


def _turns(n, overlap):
    return n + 1 if overlap else 2 * n


def _simulate(N, n_bh, nprog, pid, bm, bn, stages, overlap, causal, lpt, rng, reset=False):
    """One program's three partitions; raises on deadlock or on a read of the wrong tile.
    reset: restart the K/V and turn counts at every tile, as a per-tile kernel would (wrong)."""
    n_m = N // (2 * bm)
    tiles = range(pid, n_m * n_bh, nprog)
    q_ready, q_empty = [_Bar(1) for _ in range(4)], [_Bar(1) for _ in range(4)]
    k_ready, v_ready = [_Bar(1) for _ in range(stages)], [_Bar(1) for _ in range(stages)]
    empty, turn = [_Bar(2) for _ in range(stages)], [_Bar(1) for _ in range(2)]
    slot = {}  # ("q" | "k" | "v", index) -> what the last landed load wrote
    inflight = []  # TMA loads issued, not landed: (barrier, slot key, value)

    def n_all_of(pid_m):
        return _key_tiles(pid_m * 2 * bm + bm, N, bm, bn, causal)[1]

    def producer():
        i = c = 0
        for t in tiles:
            c = 0 if reset else c
            pid_m, pid_bh = _tile_coords(t, n_m, n_bh, lpt, causal)
            for wg in range(2):
                qi = (i % 2) * 2 + wg
                yield q_empty[qi], ((i // 2) & 1) ^ 1
                inflight.append((q_ready[qi], ("q", qi), (t, wg)))
            n_all = n_all_of(pid_m)
            for j in range(n_all):
                cj = c + j
                s = cj % stages
                yield empty[s], ((cj // stages) & 1) ^ 1
                inflight.append((k_ready[s], ("k", s), (pid_bh, j, t)))
                inflight.append((v_ready[s], ("v", s), (pid_bh, j, t)))
            c += n_all
            i += 1

    def consumer(WG):
        i = c = tk = 0

        def take(k):
            return turn[WG], (k & 1) ^ (1 - WG)

        def kv(name, cj, t, j):  # wait for item cj, check what landed
            bars = k_ready if name == "k" else v_ready
            yield bars[cj % stages], (cj // stages) & 1
            assert slot[(name, cj % stages)][1:] == (j, t), (name, cj, slot)

        def release(cj, t, j):  # K and V of item cj are still there until released
            for name in ("k", "v"):
                assert slot[(name, cj % stages)][1:] == (j, t), ("overwritten", name, cj, slot)
            empty[cj % stages].arrive()

        for t in tiles:
            c, tk = (0, 0) if reset else (c, tk)
            pid_m, _ = _tile_coords(t, n_m, n_bh, lpt, causal)
            row0 = pid_m * 2 * bm + WG * bm
            n_mine = _key_tiles(row0, N, bm, bn, causal)[1]
            n_all = n_all_of(pid_m)
            qi = (i % 2) * 2 + WG
            yield q_ready[qi], (i // 2) & 1
            assert slot[("q", qi)] == (t, WG)
            if overlap:
                yield take(tk)
                yield from kv("k", c, t, 0)
                turn[1 - WG].arrive()
                for j in range(1, n_mine):
                    cj = c + j
                    yield take(tk + j)
                    yield from kv("k", cj, t, j)
                    yield from kv("v", cj - 1, t, j - 1)
                    turn[1 - WG].arrive()
                    assert slot[("k", cj % stages)][1:] == (j, t)  # still there when S lands
                    release(cj - 1, t, j - 1)
                assert slot[("q", qi)] == (t, WG)
                q_empty[qi].arrive()
                cl = c + n_mine - 1
                yield take(tk + n_mine)
                yield from kv("v", cl, t, n_mine - 1)
                turn[1 - WG].arrive()
                release(cl, t, n_mine - 1)
            else:
                for j in range(n_mine):
                    cj = c + j
                    yield take(tk + 2 * j)
                    yield from kv("k", cj, t, j)
                    turn[1 - WG].arrive()
                    yield take(tk + 2 * j + 1)
                    yield from kv("v", cj, t, j)
                    turn[1 - WG].arrive()
                    release(cj, t, j)
                assert slot[("q", qi)] == (t, WG)
                q_empty[qi].arrive()
            for j in range(n_mine, n_all):
                cj = c + j
                yield from kv("k", cj, t, j)
                yield from kv("v", cj, t, j)
                release(cj, t, j)
            for k in range(_turns(n_mine, overlap), _turns(n_all, overlap)):
                yield take(tk + k)
                turn[1 - WG].arrive()
            c += n_all
            tk += _turns(n_all, overlap)
            i += 1

    agents = {"producer": producer(), "wg0": consumer(0), "wg1": consumer(1)}
    waiting = {name: None for name in agents}  # the (barrier, parity) each is blocked on
    done = set()
    while len(done) < len(agents) or inflight:
        ready = [n for n in agents if n not in done
                 and (waiting[n] is None or waiting[n][0].passes(waiting[n][1]))]
        choices = ready + (["tma"] if inflight else [])
        assert choices, f"deadlock: {waiting}"
        pick = rng.choice(choices)
        if pick == "tma":
            bar, key, value = inflight.pop(rng.randrange(len(inflight)) if rng.random() < 0.3
                                           else 0)
            slot[key] = value
            bar.arrive()
            continue
        try:
            waiting[pick] = next(agents[pick])
        except StopIteration:
            done.add(pick)
            waiting[pick] = None


@pytest.mark.parametrize("overlap", [False, True])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("bm,bn,stages", [(64, 128, 2), (64, 128, 3), (64, 64, 2)])
def test_schedule_model_finishes_and_reads_the_right_tiles(overlap, causal, bm, bn, stages):
    """(64, 64) gives the causal first warpgroup fewer key tiles than the second: the extra
    releases and empty turns run. Shapes: several tiles a program, a last program with fewer,
    an LPT group with fewer heads."""
    rng = random.Random(f"{overlap}{causal}{bm}{bn}{stages}")
    for N, n_bh, nprog, lpt in [(256, 3, 2, 2), (512, 5, 3, 2), (384, 2, 5, 1), (1024, 4, 7, 3)]:
        n_tiles = N // (2 * bm) * n_bh
        for pid in range(min(nprog, n_tiles)):
            for _ in range(3):
                _simulate(N, n_bh, min(nprog, n_tiles), pid, bm, bn, stages, overlap, causal,
                          lpt, rng)


def test_schedule_model_catches_counts_reset_per_tile():
    """The model is not vacuous: restarting the K/V and turn counts at each tile (hopper.py's
    per-launch indexing) goes wrong once a tile leaves the counts odd (3 key tiles at N = 384
    with a two-stage ring): a deadlock or a read of the wrong tile."""
    rng = random.Random(0)
    failures = 0
    for _ in range(20):
        try:
            _simulate(384, 4, 1, 0, 64, 128, 2, True, False, 1, rng, reset=True)
        except AssertionError:
            failures += 1
    assert failures > 0
    for _ in range(20):  # the kernel's running counts on the same shape
        _simulate(384, 4, 1, 0, 64, 128, 2, True, False, 1, rng)
