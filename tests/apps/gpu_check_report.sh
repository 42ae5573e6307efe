#!/usr/bin/env bash
# scripts/gpu_check_report.py on made-up inputs shaped like a GPU run's: the ratios come out right, test
# reports from several ranks add up, and a GPU test skipped for want of a device, or a GPU training summary
# without its GPU figures, fails the report.
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/w" "$work/r"
printf 'gpu.name\t"NVIDIA H200"\nbuild.seconds\t95\npytorch.version\t"2.11\r"\n' > "$work/facts"
gtest_report() {  # gtest_report FILE PASSED_NAME SKIPPED_NAME
  cat > "$1" <<JSON
{"testsuites": [{"name": "GradSyncGpu", "testsuite": [
  {"name": "$2", "status": "RUN", "result": "COMPLETED"},
  {"name": "$3", "status": "RUN", "result": "SKIPPED"}]}]}
JSON
}
gtest_report "$work/w/gtest_grad_sync_np2.0.json" RingRanks NcclTrains
gtest_report "$work/w/gtest_grad_sync_np2.1.json" RingRanks NcclTrains
summary='{"type": "summary", "device": "cuda:0", "median_step_s": 0.05, "img_per_s": 4800.0, "peak_gpu_mem_bytes": 2e10, "steps": 60, "train_loss": 6.5, "elapsed_s": 3.2, "cudnn_conv_algorithms": ["fwd 256x56x56x64 k1: IMPLICIT_PRECOMP_GEMM"]}'
printf '{"type": "plan", "global_batch": 256, "world_size": 1}\n%s\n' "$summary" > "$work/r/train_resnet50.jsonl"
echo '{"median_step_s": 0.06, "img_per_s": 4266.7, "img_per_s_wall": 4000.0, "peak_gpu_mem_bytes": 2.5e10, "steps": 60, "last_loss": 6.6, "elapsed_s": 3.8}' > "$work/r/peer_resnet50.json"
: > "$work/r/tests.log"

python3 "$repo/scripts/gpu_check_report.py" "$work/facts" "$work/w" "$work/r" full grad_sync_np2 > "$work/out.txt"
cat "$work/out.txt"
python3 - "$work/r/gpu_check.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
assert r["gpu"]["name"] == "NVIDIA H200" and r["build"]["seconds"] == 95, r
t = r["tests"]["grad_sync_np2"]
assert t["passed"] == 2 and t["failed"] == [] and t["skipped"] == ["GradSyncGpu.NcclTrains"], t
run = r["training"]["resnet50"]
assert abs(run["speed_ratio_median_step"] - 1.2) < 1e-9 and abs(run["memory_ratio"] - 0.8) < 1e-9, run
assert abs(run["ringtrain"]["img_per_s"] - 256 / 0.05) < 1e-6 and run["ringtrain"]["img_per_s_wall"] == 4800.0, run
assert abs(run["speed_ratio_wall"] - 1.2) < 1e-9 and run["pytorch"]["img_per_s"] == 4266.7, run
assert r["goals"] == {"resnet50_bf16_img_per_s_at_least_6000": False, "resnet50_bf16_at_least_1.15x_pytorch": True}, r["goals"]
assert r["cudnn_conv_algorithms_resnet50"] == ["fwd 256x56x56x64 k1: IMPLICIT_PRECOMP_GEMM"] and r["failed"] == [], r
print("report ok")
PY
grep -q "resnet50  ringtrain 5120 img/s" "$work/out.txt"

# A GPU test skipped because the program saw no device: the check checked nothing, so it fails.
echo "no CUDA device: CUDA driver version is insufficient for CUDA runtime version" > "$work/r/tests.log"
if python3 "$repo/scripts/gpu_check_report.py" "$work/facts" "$work/w" "$work/r" full grad_sync_np2 > "$work/out.txt" 2>&1; then
  echo "a GPU test skipped for want of a device must fail the report" >&2; exit 1
fi
grep -q "GPU tests skipped for want of a device: no CUDA device: CUDA driver version" "$work/out.txt"
: > "$work/r/tests.log"

# A GPU run whose summary lacks the GPU figures (e.g. it fell back to the CPU).
sed 's/"device": "cuda:0"/"device": "cpu"/; s/, "peak_gpu_mem_bytes": 2e10//' "$work/r/train_resnet50.jsonl" > "$work/x" && mv "$work/x" "$work/r/train_resnet50.jsonl"
if python3 "$repo/scripts/gpu_check_report.py" "$work/facts" "$work/w" "$work/r" full > "$work/out.txt" 2>&1; then
  echo "a GPU training summary without GPU figures must fail the report" >&2; exit 1
fi
grep -q "train_resnet resnet50: the summary lacks peak_gpu_mem_bytes or ran on cpu" "$work/out.txt"
# A program that never wrote a report is a failed test, named.
python3 "$repo/scripts/gpu_check_report.py" "$work/facts" "$work/w" "$work/r" build test_cuda_conv > "$work/out.txt"
grep -q "tests test_cuda_conv .* 1 failed (no report" "$work/out.txt"
echo "gpu_check_report: all cases behave"
