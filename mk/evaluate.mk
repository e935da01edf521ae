# Trace-driven evaluation: report, CSVs and plots in reports/evaluation/ (gitignored). Design §21: the paper's baselines
# by name on two campuses (count-faithful and paper-hazard), 8 seeds for the headline policies; the last two lines are
# `evaluate-paper-hazard: ...` then `evaluate: ...`. 10-16 min (574-934 s in the report, 1,128-1,830 CPU-s) on the
# shared 2-core machine (design §21.3).
# `evaluate-quick` builds the same report small (both campuses, 2 seeds; under a minute); make test runs it through
# tests/sim/test_evaluate_quick.py, which also checks the report's structure and its verdicts.
# `evaluate-families` runs every online policy on six trace families (design §21.5; scheduler/sim/families.py),
# 8 seeds each, paired, over 2 processes, and writes a regret report per family to reports/families/ (gitignored);
# its last line is `families: ...`. `evaluate-families-quick` is the same, tiny (6 nodes, 1 day, 2 seeds).
# `evaluate-gangs` runs ReclaimNet against gang kill-and-requeue on the campus with gang and elastic jobs (design
# §21.6; scheduler/sim/gangs.py), 8 seeds, about 1.5 minutes; its last line is `gangs: ...`. `make evaluate` prints
# the same rows above its own last lines.
.PHONY: evaluate evaluate-quick evaluate-families evaluate-families-quick evaluate-gangs

evaluate: venv
	$(PY) scripts/evaluate.py --out reports/evaluation

evaluate-quick: venv
	$(PY) scripts/evaluate.py --out reports/evaluation-quick --quick

evaluate-families: venv
	$(PY) scripts/evaluate_families.py --out reports/families --jobs 2

evaluate-families-quick: venv
	$(PY) scripts/evaluate_families.py --out reports/families-quick --jobs 2 --quick

evaluate-gangs: venv
	$(PY) scripts/evaluate_gangs.py --out reports/gangs --jobs 2
