# Trace-driven evaluation: report, CSVs and plots in reports/evaluation/ (gitignored).
.PHONY: evaluate evaluate-quick

evaluate: venv
	$(PY) scripts/evaluate.py --out reports/evaluation

evaluate-quick: venv
	$(PY) scripts/evaluate.py --out reports/evaluation-quick --quick
