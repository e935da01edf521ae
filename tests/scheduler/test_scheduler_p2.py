"""P2 (design §3) and the campus tree: bottlenecks, feasibility, locality, survival, score."""

import numpy as np
import pytest
import scheduler_literal as literal
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.p2 import P2Request, select_destination, survival
from scheduler.topology import BottleneckIndex, CampusTree

SETTINGS = settings(max_examples=40, deadline=None)


@st.composite
def random_trees(draw: st.DrawFn) -> tuple[CampusTree, np.ndarray, list[tuple[str, str]]]:
    """Any tree: vertex i > 0 hangs off a random earlier vertex; a random subset are nodes."""
    n_v = draw(st.integers(2, 14))
    parents = [draw(st.integers(0, i - 1)) for i in range(1, n_v)]
    names = [f"v{i}" for i in range(n_v)]
    perm = draw(st.permutations(range(n_v)))
    n_nodes = draw(st.integers(1, n_v))
    node_ids = [names[i] for i in perm[:n_nodes]]
    ends = [(names[i], names[p]) for i, p in zip(range(1, n_v), parents, strict=True)]
    tree = CampusTree.from_links([f"l{i}" for i in range(1, n_v)], [a for a, _ in ends], [b for _, b in ends], node_ids)
    bw = np.array(draw(st.lists(st.sampled_from([1e6, 5e6, 1e7, 1.25e8, 1.25e9]), min_size=n_v - 1, max_size=n_v - 1)))
    return tree, bw, ends


@SETTINGS
@given(random_trees(), st.data())
def test_bottlenecks_and_pair_sums_match_brute_force(case: tuple, data: st.DataObject) -> None:
    tree, bw, ends = case
    lt = literal.LiteralTree([{"a": a, "b": b} for a, b in ends])
    n = tree.n_nodes
    brute = np.array(
        [[np.inf if s == d else lt.bottleneck(tree.node_ids[s], tree.node_ids[d], bw.tolist()) for d in range(n)]
         for s in range(n)]
    )
    index = BottleneckIndex.build(tree, bw)
    for s in range(n):
        assert np.array_equal(tree.bottleneck_bytes_per_s(bw, s, np.arange(n)), brute[s])
        assert np.array_equal(index.bottleneck_from(s, np.arange(n)), brute[s])
    members = np.array(data.draw(st.lists(st.booleans(), min_size=n, max_size=n)))
    want = [sum(1 / brute[d, o] for o in range(n) if members[o] and o != d) for d in range(n)]
    assert np.allclose(index.inverse_bottleneck_sums(members, np.arange(n)), want, rtol=1e-9, atol=0)
    src = np.array(data.draw(st.lists(st.integers(0, n - 1), min_size=1, max_size=5)))
    dst = np.array(data.draw(st.lists(st.integers(0, n - 1), min_size=len(src), max_size=len(src))))
    pair, link = tree.path_incidence(src, dst)
    for k in range(len(src)):
        assert sorted(link[pair == k].tolist()) == sorted(lt.path(tree.node_ids[src[k]], tree.node_ids[dst[k]]))
        assert sorted(tree.path_links(src[k], dst[k]).tolist()) == sorted(link[pair == k].tolist())


@pytest.mark.parametrize(
    ("links", "message"),
    [
        ([("l1", "a", "s"), ("l2", "b", "s"), ("l3", "a", "b")], "not a tree"),
        ([("l1", "a", "s")], "'b' is not connected"),
        ([("l1", "a", "a"), ("l2", "b", "a")], "to itself"),
        ([("l1", "a", "s"), ("l1", "b", "s")], "duplicate link"),
    ],
)
def test_non_trees_are_rejected(links: list, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        CampusTree.from_links([x[0] for x in links], [x[1] for x in links], [x[2] for x in links], ["a", "b"])


def campus(n_buildings: int, per_building: int) -> tuple[list[str], list[str], list[str], list[str], list[str]]:
    lid, a, b, nodes, building = [], [], [], [], []
    for k in range(n_buildings):
        lid.append(f"up{k}")
        a.append(f"sw{k}")
        b.append("core")
        for j in range(per_building):
            node = f"n{k}-{j}"
            nodes.append(node)
            building.append(f"B{k}")
            lid.append(f"acc-{node}")
            a.append(node)
            b.append(f"sw{k}")
    return lid, a, b, nodes, building


@st.composite
def p2_cases(draw: st.DrawFn) -> tuple[P2Request, list[dict], dict, literal.LiteralTree, list[float]]:
    lid, a, b, nodes, building = campus(draw(st.integers(1, 3)), draw(st.integers(1, 4)))
    n = len(nodes)
    tree = CampusTree.from_links(lid, a, b, nodes)
    bw = draw(st.lists(st.sampled_from([3e7, 1e8, 1.25e8, 3e8, 1.25e9]), min_size=len(lid), max_size=len(lid)))
    rows = [
        {
            "id": nodes[i],
            "building": building[i],
            "free_gpus": draw(st.integers(0, 4)),
            "vram_gb": draw(st.sampled_from([24.0, 48.0, 80.0])),
            "capability": draw(st.sampled_from([8.0, 8.6, 8.9])),
            "compatible": draw(st.booleans()) or draw(st.booleans()),
            "hazard_per_s_by_hour": draw(st.lists(st.floats(0, 2e-3), min_size=24, max_size=24)),
        }
        for i in range(n)
    ]
    src = draw(st.integers(0, n - 1))
    holder = draw(st.integers(0, n - 1))
    req = {
        "source": nodes[src],
        "ckpt_holder": nodes[holder],
        "ckpt_bytes": draw(st.floats(1e8, 5e10)),
        "restart_s": draw(st.floats(0, 60)),
        "notice_s": draw(st.one_of(st.none(), st.floats(10, 2000))),
        "remaining_s": draw(st.floats(0, 3e5)),
        "gpus": draw(st.integers(1, 2)),
        "vram_gb": draw(st.sampled_from([0.0, 30.0])),
        "min_capability": draw(st.sampled_from([0.0, 8.6])),
        "alpha": draw(st.sampled_from([0.0, 1.0, 3.0])),
        "k_min": draw(st.integers(0, 3)),
        "now_hour": draw(st.floats(0, 23.99)),
    }
    p2 = P2Request(
        tree=tree,
        link_bytes_per_s=np.array(bw),
        building=np.array(building, dtype=object),
        free_gpus=np.array([r["free_gpus"] for r in rows]),
        vram_gb=np.array([r["vram_gb"] for r in rows]),
        capability=np.array([r["capability"] for r in rows]),
        hazard_per_s_by_hour=np.array([r["hazard_per_s_by_hour"] for r in rows]),
        compatible=np.array([r["compatible"] for r in rows]),
        source=src,
        ckpt_holder=holder,
        ckpt_bytes=req["ckpt_bytes"],
        restart_s=req["restart_s"],
        notice_s=req["notice_s"],
        remaining_s=req["remaining_s"],
        gpus=req["gpus"],
        vram_gb_needed=req["vram_gb"],
        min_capability=req["min_capability"],
        alpha=req["alpha"],
        k_min=req["k_min"],
        now_hour=req["now_hour"],
    )
    lt = literal.LiteralTree([{"a": a[i], "b": b[i]} for i in range(len(lid))])
    return p2, rows, req, lt, bw


@SETTINGS
@given(p2_cases())
def test_p2_never_picks_excluded_and_picks_min_score(case: tuple) -> None:
    p2, rows, req, lt, bw = case
    d = select_destination(p2)
    excluded = {i for i, _ in d.excluded}
    assert set(d.candidate.tolist()).isdisjoint(excluded)
    assert p2.source not in d.candidate
    assert p2.source not in excluded
    if d.destination is None:
        assert d.candidate.size == 0
    else:
        assert d.destination not in excluded and d.destination != p2.source
        assert d.destination in d.candidate
        # The minimum score (ties up to rounding go to the smallest id).
        assert d.score[d.candidate == d.destination][0] <= d.score.min() * (1 + 1e-12)
        near = d.candidate[d.score <= d.score.min() * (1 + 1e-12)]
        assert p2.tree.node_ids[d.destination] == min(p2.tree.node_ids[i] for i in near)
    # Every other node is accounted for: a candidate, excluded, or feasible but outside the locality set.
    assert len(excluded) + d.candidate.size <= p2.tree.n_nodes - 1
    for i, reason in d.excluded:
        r = rows[i]
        if reason == "vram":
            assert r["vram_gb"] < p2.vram_gb_needed
        elif reason == "capability":
            assert r["capability"] < p2.min_capability
        elif reason == "compatibility":
            assert not r["compatible"]
        elif reason == "busy":
            assert r["free_gpus"] < p2.gpus
        else:
            assert reason == "deadline" and p2.notice_s is not None
    if p2.notice_s is not None:
        assert np.all(d.transfer_s <= p2.notice_s)
    assert np.all((d.survival >= 0) & (d.survival <= 1))
    # Same scores and choice as the literal per-node reference.
    best, scores = literal.p2_select(lt, bw, rows, req)
    got = {p2.tree.node_ids[i]: s for i, s in zip(d.candidate.tolist(), d.score, strict=True)}
    assert got.keys() == scores.keys()
    for k, v in scores.items():
        assert got[k] == pytest.approx(v, rel=1e-9, abs=1e-9)  # scores of 0 come out as 0 or ~1e-12
    assert (None if d.destination is None else p2.tree.node_ids[d.destination]) == best


def test_locality_prefers_the_building_when_k_min_met() -> None:
    lid, a, b, nodes, building = campus(2, 3)
    tree = CampusTree.from_links(lid, a, b, nodes)
    bw = np.full(len(lid), 1.25e8)
    base = dict(
        tree=tree, link_bytes_per_s=bw, building=np.array(building), free_gpus=np.ones(6), vram_gb=np.full(6, 24.0),
        capability=np.full(6, 8.6), hazard_per_s_by_hour=np.zeros((6, 24)), compatible=None, source=0, ckpt_holder=0,
        ckpt_bytes=1e9, restart_s=0.0, notice_s=None, remaining_s=3600.0,
    )
    d = select_destination(P2Request(**base))
    assert d.local.all() and set(d.candidate.tolist()) == {1, 2}
    d = select_destination(P2Request(**base, k_min=3))  # only 2 local: fall back to the campus
    assert set(d.candidate.tolist()) == {1, 2, 3, 4, 5}
    assert d.destination == 1  # ties on score: smallest id


def test_empty_locality_set_never_wins_even_with_k_min_zero() -> None:
    """Lemma 3 with k_min = 0 and no feasible local node: fall back to D_c, not "no destination"."""
    lid, a, b, nodes, building = campus(2, 2)
    tree = CampusTree.from_links(lid, a, b, nodes)
    req = P2Request(
        tree=tree, link_bytes_per_s=np.full(len(lid), 1.25e8), building=np.array(building),
        free_gpus=np.array([1, 0, 1, 1]), vram_gb=np.full(4, 24.0), capability=np.full(4, 8.6),
        hazard_per_s_by_hour=np.zeros((4, 24)), compatible=None, source=0, ckpt_holder=0, ckpt_bytes=1e9,
        restart_s=0.0, notice_s=None, remaining_s=3600.0, k_min=0,
    )
    d = select_destination(req)
    assert d.excluded == ((1, "busy"),)  # the only other local node
    assert set(d.candidate.tolist()) == {2, 3} and not d.local.any()
    assert d.destination == 2


def test_emergency_transfer_starts_at_the_checkpoint_holder() -> None:
    """design §3: after an emergency the source is gone; T_mig is measured from the freshest replica's holder."""
    lid, a, b, nodes, building = campus(2, 2)  # B0: n0-0 (source), n0-1; B1: n1-0 (holder), n1-1
    tree = CampusTree.from_links(lid, a, b, nodes)
    bw = np.full(len(lid), 1.25e8)
    bw[lid.index("up0")] = bw[lid.index("up1")] = 1e7  # crossing the core is slow
    req = P2Request(
        tree=tree, link_bytes_per_s=bw, building=np.array(building), free_gpus=np.array([1, 1, 0, 1]),
        vram_gb=np.full(4, 24.0), capability=np.full(4, 8.6), hazard_per_s_by_hour=np.zeros((4, 24)),
        compatible=None, source=0, ckpt_holder=2, ckpt_bytes=1e9, restart_s=5.0, notice_s=None, remaining_s=3600.0,
        k_min=2,
    )
    d = select_destination(req)
    transfer = dict(zip(d.candidate.tolist(), d.transfer_s.tolist(), strict=True))
    assert transfer[3] == pytest.approx(1e9 / 1.25e8 + 5.0)  # holder → n1-1 stays in building B1
    assert transfer[1] == pytest.approx(1e9 / 1e7 + 5.0)  # holder → n0-1 crosses both slow uplinks
    assert d.destination == 3  # only one local candidate (k_min 2): the campus, where the holder's building wins


def test_volatile_node_loses_to_a_stable_one() -> None:
    lid, a, b, nodes, building = campus(1, 3)
    tree = CampusTree.from_links(lid, a, b, nodes)
    hz = np.zeros((3, 24))
    hz[1] = 1e-3  # n0-1 is reclaimed often
    req = P2Request(
        tree=tree, link_bytes_per_s=np.full(len(lid), 1.25e8), building=np.array(building), free_gpus=np.ones(3),
        vram_gb=np.full(3, 24.0), capability=np.full(3, 8.6), hazard_per_s_by_hour=hz, compatible=None, source=0,
        ckpt_holder=0, ckpt_bytes=1e9, restart_s=0.0, notice_s=None, remaining_s=7200.0, k_min=1,
    )
    d = select_destination(req)
    assert d.destination == 2


def test_survival_integrates_the_hourly_profile_with_wraparound() -> None:
    h = np.zeros((1, 24))
    h[0, 23] = 1e-4
    h[0, 0] = 2e-4
    s = survival(h, now_hour=23.5, remaining_s=3600.0)  # half an hour at 1e-4, half at 2e-4
    assert s[0] == pytest.approx(np.exp(-(1800 * 1e-4 + 1800 * 2e-4)))
    assert survival(h, 5.0, 0.0)[0] == 1.0
    full_day = survival(h, 0.0, 2 * 86400.0)[0]
    assert full_day == pytest.approx(np.exp(-2 * 3600 * (1e-4 + 2e-4)))
