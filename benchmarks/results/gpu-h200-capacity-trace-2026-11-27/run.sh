#!/usr/bin/env bash
# One-off: the capacity search and the trace replay on a real GPU against the stand-in.
set -u
out=/tmp/gc2; mkdir -p $out
site=$out/site-packages
python3 -m pip install --quiet --no-index --no-deps --no-compile --target $site scripts/wheels/*.whl > $out/pip.log 2>&1
export PYTHONPATH="$site:$PWD" PYTHONUNBUFFERED=1
python3 -m pytest_qwenperf.cli.main tiny-model --model embedded:gpu > $out/model.log 2>&1
timeout 330 python3 -m pytest -p pytest_qwenperf.plugin.hooks perf_tests/test_capacity.py perf_tests/test_trace.py perf_tests/test_throughput.py \
  -m hopper -p no:cacheprovider -o addopts= -rA \
  --qwenperf-suite benchmarks/results/gpu-h200-capacity-trace-2026-11-27/suite.toml \
  --qwenperf-launcher "python3 $PWD/tests/standins/model_vllm.py" \
  --qwenperf-baselines $out/no-baselines --qwenperf-json $out/session.json \
  --qwenperf-log-dir $out/logs --qwenperf-history $out/history.sqlite > $out/session.log 2>&1
echo "pytest exit $?" >> $out/session.log
python3 -m pytest_qwenperf.cli.main compare $out/session.json $out/session.json --pareto $out/pareto.png > $out/compare.log 2>&1
echo "compare exit $?" >> $out/compare.log
