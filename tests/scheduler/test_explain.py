"""scheduler.explain: why a queued job waits, why P2 chose a node, why P1 chose an interval — pure, in plain words."""

from __future__ import annotations

import ast
import math
from pathlib import Path

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler import explain as ex
from scheduler.explain import FITS, CampusNodes, Candidate, JobNeeds
from scheduler.p2 import feasible_mask


def _nodes(availability: list[str], lendable: list[int], free: list[int], vram: list[float] | None = None,
           capability: list[float] | None = None, **extra: object) -> CampusNodes:
    n = len(availability)
    return CampusNodes(availability=np.array(availability, dtype=object), lendable_gpus=np.array(lendable),
                       free_gpus=np.array(free, dtype=float), vram_gb=np.array(vram or [80.0] * n),
                       capability=np.array(capability or [8.0] * n), **extra)  # type: ignore[arg-type]


# --- classify ---------------------------------------------------------------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_a_node_fits_exactly_when_p2_would_take_it(data: st.DataObject) -> None:
    n = data.draw(st.integers(1, 12))
    lendable = np.array(data.draw(st.lists(st.integers(0, 8), min_size=n, max_size=n)))
    availability = np.array(data.draw(st.lists(st.sampled_from(ex.AVAILABILITY), min_size=n, max_size=n)),
                            dtype=object)
    # free GPUs as the read model counts them: only lent nodes have any, never more than they lend
    free = np.array([data.draw(st.integers(0, int(k))) if a == "lent" else 0
                     for a, k in zip(availability, lendable, strict=True)], dtype=float)
    vram = np.array(data.draw(st.lists(st.sampled_from([16.0, 24.0, 48.0, 80.0]), min_size=n, max_size=n)))
    cap = np.array(data.draw(st.lists(st.sampled_from([7.0, 8.0, 8.6, 9.0]), min_size=n, max_size=n)))
    compatible = data.draw(st.none() | st.lists(st.booleans(), min_size=n, max_size=n).map(np.array))
    needs = JobNeeds(gpus=data.draw(st.integers(1, 8)), vram_gb=data.draw(st.sampled_from([0.0, 24.0, 80.0])),
                     min_capability=data.draw(st.sampled_from([0.0, 8.0])), compatible=compatible)
    nodes = CampusNodes(availability=availability, lendable_gpus=lendable, free_gpus=free, vram_gb=vram,
                        capability=cap)
    codes = ex.classify(nodes, needs)
    p2 = feasible_mask(free, vram, cap, compatible, gpus=needs.gpus, vram_gb_needed=needs.vram_gb,
                       min_capability=needs.min_capability)
    assert ((codes == FITS) == p2).all()
    assert set(codes.tolist()) <= {FITS, *ex.REASONS}
    summary = ex.summarise(nodes, needs, codes)
    assert sum(count for _, count in summary.reasons) + summary.fits_now == n
    assert summary.text.endswith(".") and "#" not in summary.text


def test_each_node_gets_its_first_reason_hardware_before_availability() -> None:
    nodes = _nodes(["lent", "lent", "reclaiming", "not_lent", "offline", "lent", "lent"],
                   lendable=[4, 2, 4, 4, 4, 4, 4], free=[1, 2, 0, 0, 0, 4, 0],
                   vram=[80, 80, 80, 80, 80, 80, 24], capability=[8, 8, 8, 8, 8, 8, 8])
    codes = ex.classify(nodes, JobNeeds(gpus=4, vram_gb=40))
    assert codes.tolist() == ["busy", "too_small", "reclaiming", "not_lent", "offline", FITS, "vram"]
    with_checkpoint = ex.classify(nodes, JobNeeds(gpus=4, compatible=np.array([True] * 5 + [False, True])))
    assert with_checkpoint[5] == "compatibility"  # the one free node cannot restore the checkpoint
    assert ex.classify(nodes, JobNeeds(gpus=1, min_capability=9.0)).tolist() == ["capability"] * 7


# --- summarise --------------------------------------------------------------------------------------------------------


def test_waiting_reason_names_the_nodes_that_would_fit_and_when_their_window_opens() -> None:
    night = "18:00–08:00 daily"
    nodes = _nodes(["not_lent", "not_lent", "reclaiming", "lent"], lendable=[4, 4, 4, 1], free=[0, 0, 0, 1],
                   label=["A100", "A100", "A100", "RTX 3090"], window=[night, night, "", ""],
                   next_window_s=np.array([3 * 3600.0, 5 * 3600.0, np.nan, np.nan]))
    summary = ex.summarise(nodes, JobNeeds(gpus=4))
    assert summary.text == (
        "No lent node has 4 GPUs free right now. Of the 3 A100 nodes that would fit, 2 are lent only "
        "18:00–08:00 daily (the next window opens in 3 h) and 1 is being reclaimed by its owner.")
    assert summary.reasons == (("too_small", 1), ("reclaiming", 1), ("not_lent", 2))
    assert summary.next_window_s == 3 * 3600.0
    assert summary.fits_now == 0
    assert summary.as_dict()["reasons"] == [{"reason": "too_small", "nodes": 1}, {"reason": "reclaiming", "nodes": 1},
                                            {"reason": "not_lent", "nodes": 2}]


def test_one_kind_of_obstacle_reads_as_one_sentence_about_those_nodes() -> None:
    nodes = _nodes(["lent", "lent", "lent"], lendable=[2, 2, 1], free=[1, 0, 1], vram=[48, 48, 48],
                   label=["A6000", "A6000", "RTX 4090"])
    summary = ex.summarise(nodes, JobNeeds(gpus=2, vram_gb=40))
    assert summary.text == ("No lent node has 2 GPUs free with 40 GB each right now. The 2 A6000 nodes that would "
                            "fit are busy with other jobs.")
    assert summary.next_window_s is None


def test_a_request_no_node_could_ever_satisfy_says_so_and_what_the_campus_offers() -> None:
    nodes = _nodes(["lent", "not_lent"], lendable=[4, 2], free=[4, 0], vram=[80, 48])
    too_many = ex.summarise(nodes, JobNeeds(gpus=16))
    assert too_many.text.startswith("No node on the campus can run it as requested: 2 have fewer than 16 GPUs to lend.")
    assert "The most one node lends is 4 GPUs, with at most 80 GB each" in too_many.text
    too_big = ex.summarise(nodes, JobNeeds(gpus=1, vram_gb=500))
    assert "2 have less than 500 GB per GPU" in too_big.text
    assert too_big.reasons == (("vram", 2),)


def test_a_node_with_room_now_means_the_next_round_places_it() -> None:
    summary = ex.summarise(_nodes(["lent", "lent"], lendable=[4, 4], free=[4, 0]), JobNeeds(gpus=2))
    assert summary.fits_now == 1
    assert summary.text == "1 lent node has 2 GPUs free for it now: it starts at the scheduler's next round."
    assert summary.reasons == (("busy", 1),)


def test_an_empty_campus_says_the_job_waits_for_a_lab_to_lend() -> None:
    assert "No node is registered" in ex.summarise(_nodes([], lendable=[], free=[]), JobNeeds(gpus=1)).text


# --- lending windows ---------------------------------------------------------------------------------------------------


def test_next_window_is_counted_from_now_across_midnight_and_the_week() -> None:
    night_monday = [(0, 18 * 60, 8 * 60)]  # Monday 18:00 to Tuesday 08:00
    assert ex.next_window_opens_s(night_monday, weekday=0, minute=15 * 60) == 3 * 3600.0
    assert ex.next_window_opens_s(night_monday, weekday=1, minute=7 * 60) is None  # still open on Tuesday morning
    assert ex.next_window_opens_s(night_monday, weekday=1, minute=9 * 60) == (6 * 24 + 9) * 3600.0  # next Monday
    assert ex.next_window_opens_s([], weekday=3, minute=0) is None  # no windows: always lent


def test_window_text_groups_days_sharing_hours() -> None:
    assert ex.window_text([(d, 18 * 60, 8 * 60) for d in range(7)]) == "18:00–08:00 daily"
    assert ex.window_text([(d, 9 * 60, 17 * 60) for d in (5, 6)]) == "09:00–17:00 at weekends"
    assert ex.window_text([(0, 60, 120), (2, 60, 120)]) == "01:00–02:00 on Mon, Wed"
    assert ex.window_text([]) == ""


# --- P2 in words ------------------------------------------------------------------------------------------------------


def _candidate(name: str, bw: float, survival: float, t_bar: float, *, ckpt: float = 4.2e9, restart: float = 30.0,
               remaining: float = 7200.0) -> Candidate:
    transfer = ckpt / bw + restart
    return Candidate(name, transfer_s=transfer, survival=survival, score=transfer + (1 - survival) * t_bar,
                     local=True)


def test_placement_words_name_the_score_terms_and_what_each_runner_up_lost_on() -> None:
    risk = lambda per_h: math.exp(-per_h * 2)  # noqa: E731  survival over the 2 h left at a reclaim rate
    chosen = _candidate("lab-a-03", 2.1e9, risk(0.2), 60.0)
    riskier = _candidate("lab-b-01", 2.1e9, risk(0.9), 60.0)
    slower = _candidate("lab-c-02", 1.25e8, risk(0.2), 60.0)
    text = ex.placement_words(chosen, [riskier, slower], ckpt_bytes=4.2e9, restart_s=30.0, remaining_s=7200.0,
                              excluded={"busy": 40, "vram": 8})
    assert text.startswith("lab-a-03 was chosen: 2.1 GB/s to the checkpoint's copy (the fastest), 32 s to copy and "
                           "restart, the lowest reclaim risk 0.2/h (67 % chance it stays lent for the 2 h left).")
    assert "Runners-up: lab-b-01 (reclaim risk 0.9/h), lab-c-02 (only 125 MB/s to the copy)." in text
    assert text.endswith("48 other nodes could not take it: 40 had too few free GPUs and 8 had too little memory per "
                         "GPU.")
    one_reason = ex.placement_words(chosen, [], ckpt_bytes=4.2e9, restart_s=30.0, remaining_s=7200.0,
                                    excluded={"busy": 1})
    assert one_reason.endswith("The other node had too few free GPUs.")


def test_placement_words_say_a_holder_needs_no_copy_and_ties_go_to_the_earlier_node() -> None:
    holder = Candidate("lab-a-01", transfer_s=30.0, survival=0.9, score=33.0)
    twin = Candidate("lab-a-02", transfer_s=30.0, survival=0.9, score=33.0)
    text = ex.placement_words(holder, [twin], ckpt_bytes=1e9, restart_s=30.0, remaining_s=3600.0, all_local=True)
    assert "it already holds the checkpoint's copy" in text
    assert "lab-a-02 (as good; the earlier registered node wins a tie)" in text
    assert "Only nodes in the same building were compared" in text


def test_a_fresh_start_is_explained_by_survival_alone() -> None:
    text = ex.placement_words(Candidate("n1", survival=0.97), [Candidate("n2", survival=0.90)], remaining_s=3600.0)
    assert text == ("n1 was chosen: the lowest reclaim risk 0.03/h (97 % chance it stays lent for the 1 h left). "
                    "Runners-up: n2 (reclaim risk 0.11/h).")


def test_no_destination_says_it_waits_and_why() -> None:
    text = ex.no_destination_words({"busy": 3, "deadline": 1})
    assert text == ("No node could take it, so it waits in the queue and resumes from its freshest checkpoint when "
                    "one can: 3 had too few free GPUs and 1 could not receive the checkpoint before the deadline.")


# --- P1 in words ------------------------------------------------------------------------------------------------------


def test_interval_words_give_the_rule_with_the_numbers() -> None:
    c, b, lam = 3.24e9, 270e6, 0.4 / 3600
    balance = math.sqrt(2 * c / (lam * b))  # Lemma 1: 465 s
    text = ex.interval_words(balance, ckpt_bytes=c, bandwidth_bytes_per_s=b, hazard_per_s=lam, loss_budget_s=3600)
    assert text.startswith(f"Every {ex.human_duration(balance)}: a checkpoint takes 12 s to write and send (3.2 GB at "
                           "270 MB/s); this node is reclaimed about 0.4 times an hour.")
    assert "more often would spend more time writing than it saves" in text


def test_interval_words_name_the_bound_that_clipped_the_interval() -> None:
    c, b = 3.24e9, 270e6
    lower = c / (0.2 * b)  # 60 s: writing at most 20 % of the time
    busy_node = ex.interval_words(lower, ckpt_bytes=c, bandwidth_bytes_per_s=b, hazard_per_s=100 / 3600)
    assert "writing may take at most 20 % of the job's time" in busy_node
    capped = ex.interval_words(600, ckpt_bytes=c, bandwidth_bytes_per_s=b, hazard_per_s=0.01 / 3600,
                               loss_budget_s=300)
    assert "your loss budget of 5 min caps it at twice that" in capped
    at_risk = ex.interval_words(lower, ckpt_bytes=c, bandwidth_bytes_per_s=b, hazard_per_s=100 / 3600,
                                loss_budget_s=20, at_risk=True)
    assert "Your loss budget of 20 s cannot be met at this bandwidth" in at_risk
    floored = ex.interval_words(120, ckpt_bytes=1e6, bandwidth_bytes_per_s=b, hazard_per_s=1 / 3600,
                                min_interval_s=120)
    assert "the campus floor of 2 min" in floored


def test_durations_rates_and_sizes_read_as_people_write_them() -> None:
    assert [ex.human_duration(s) for s in (1.5, 12, 580, 3600, 7500, 3 * 86400 + 4 * 3600)] == [
        "1.5 s", "12 s", "9 min 40 s", "1 h", "2 h 5 min", "3 d 4 h"]
    assert [ex.human_rate(r) for r in (2.1e9, 1.18e8, 5e3)] == ["2.1 GB/s", "118 MB/s", "5 KB/s"]
    assert ex.human_bytes(3.2e9) == "3.2 GB"


def test_explain_is_pure() -> None:
    tree = ast.parse((Path(ex.__file__)).read_text())
    imported = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {(n.module or "").split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert imported <= {"__future__", "math", "collections", "dataclasses", "typing", "numpy", "scheduler"}
