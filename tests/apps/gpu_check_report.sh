#!/usr/bin/env bash
# scripts/gpu_check_report.py on made-up inputs shaped like a GPU run's: the ratios come out right, test
# reports from several ranks add up, and a GPU test skipped for want of a device, or a GPU training summary
# without its GPU figures, fails the report. The profiles side by side (train_resnet's profile record and the
# peer's --profile-json) and fp16/fp32 (bench_step's line and profile record beside the peer's) come out
# right, with one side missing too; a dry run's empty folders give none of them.
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
# Where the GPU time goes: train_resnet --profile's record and the peer's (families on one side only too).
cat >> "$work/r/train_resnet50.jsonl" <<'JSON'
{"type": "profile", "device": "cuda:0", "steps": 5, "step_ms": 83.1, "median_step_ms": 83.0, "syncs_per_step": 0, "covered_share": 0.996, "families": [{"family": "elementwise", "calls": 823, "device_ms": 26.2, "host_ms": 5.1, "share": 0.316}, {"family": "conv_fwd", "calls": 53, "device_ms": 7.7, "host_ms": 13.5, "share": 0.093}, {"family": "data", "calls": 1, "device_ms": 0.0, "host_ms": 0.1, "share": 0.0}]}
JSON
echo '{"type": "profile", "framework": "pytorch", "device": "cuda:0", "steps": 5, "step_ms": 55.9, "median_step_ms": 55.8, "kernel_ms": 53.6, "covered_share": 0.959, "families": [{"family": "elementwise", "calls": 186, "device_ms": 9.7, "share": 0.17}, {"family": "conv_fwd", "calls": 107, "device_ms": 5.8, "share": 0.1}, {"family": "gemm", "calls": 3, "device_ms": 0.02, "share": 0.0}]}' > "$work/r/peer_profile_resnet50_bf16.json"
# fp16: bench_step's line (the check tees it into WORK) and profile record (and a line cut short), and the
# peer's; fp32: the peer's only.
printf 'ringtrain resnet50 b256 224x224x3 threads=16 median_step_s=0.1012 img_per_s=2529.6 peak_rss_mb=3000 params=25557032 tf32=on precision=fp16 loss_scaling=dynamic loss_scale=65536\nfamily calls GPU ms\n' > "$work/w/bench_resnet50_fp16.txt"
printf '%s\n{"type": "prof' '{"type": "profile", "device": "cuda:0", "steps": 5, "step_ms": 105.0, "median_step_ms": 104.0, "families": [{"family": "bn_fwd", "calls": 53, "device_ms": 20.0, "host_ms": 1.0, "share": 0.19}]}' > "$work/r/bench_resnet50_fp16.jsonl"
echo '{"median_step_s": 0.0445, "img_per_s": 5752.8, "img_per_s_wall": 5000.0, "peak_gpu_mem_bytes": 1.3e10, "steps": 20, "tf32": true, "loss_scaling": true, "last_loss": 6.0}' > "$work/r/peer_resnet50_fp16.json"
echo '{"median_step_s": 0.0822, "img_per_s": 3114.4, "img_per_s_wall": 2900.0, "peak_gpu_mem_bytes": 2.9e10, "steps": 20, "tf32": true, "loss_scaling": false, "last_loss": 6.0}' > "$work/r/peer_resnet50_fp32.json"
# CUDA graphs: ResNet-50 op by op and replayed; ResNet-18's capture failed (its line says so).
printf 'ringtrain resnet50 b256 224x224x3 threads=16 median_step_s=0.0700 img_per_s=3657.1 peak_rss_mb=3000 params=25557032 tf32=on precision=bf16\n' > "$work/w/bench_resnet50_bf16_graph_off.txt"
printf 'ringtrain resnet50 b256 224x224x3 threads=16 median_step_s=0.0560 img_per_s=4571.4 peak_rss_mb=3000 params=25557032 tf32=on cuda_graph=on precision=bf16\n' > "$work/w/bench_resnet50_bf16_graph_on.txt"
printf 'bench_step: --cuda-graph: not captured, the steps run op by op: why\nringtrain resnet18 b256 224x224x3 threads=16 median_step_s=0.0250 img_per_s=10240.0 peak_rss_mb=3000 params=11689512 tf32=on cuda_graph=failed precision=bf16\n' > "$work/w/bench_resnet18_bf16_graph_on.txt"
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
prof = r["profile_resnet50_bf16"]
assert prof["ringtrain_step_ms"] == 83.1 and prof["pytorch_step_ms"] == 55.9 and prof["pytorch_kernel_ms"] == 53.6, prof
assert prof["steps"] == {"ringtrain": 5, "pytorch": 5} and prof["ringtrain_covered_share"] == 0.996, prof
fams = prof["families"]
assert list(fams) == ["elementwise", "conv_fwd", "gemm", "data"], fams  # the largest first, either side
assert fams["elementwise"] == {"ringtrain_ms": 26.2, "pytorch_ms": 9.7, "ringtrain_calls": 823, "pytorch_calls": 186}, fams
assert fams["gemm"]["ringtrain_ms"] is None and fams["data"]["pytorch_ms"] is None, fams
pr = r["precisions_resnet50"]
fp16 = pr["fp16"]
assert fp16["ringtrain"]["median_step_s"] == 0.1012 and fp16["ringtrain"]["img_per_s"] == 2529.6, fp16
assert fp16["ringtrain"]["tf32"] == "on" and fp16["ringtrain"]["profile_step_ms"] == 105.0, fp16
assert fp16["ringtrain"]["loss_scaling"] == "dynamic", fp16
assert fp16["ringtrain"]["profile_families_ms"] == {"bn_fwd": 20.0}, fp16
assert fp16["pytorch"]["img_per_s"] == 5752.8 and fp16["pytorch"]["loss_scaling"] is True, fp16
assert abs(fp16["speed_ratio_median_step"] - 0.0445 / 0.1012) < 1e-12, fp16
assert list(pr["fp32"]) == ["pytorch"] and pr["fp32"]["pytorch"]["median_step_s"] == 0.0822, pr
g = r["cuda_graph_bf16"]
assert g["resnet50"] == {"cuda_graph": "on", "op_by_op_median_step_s": 0.07, "graph_median_step_s": 0.056,
                         "speedup": 0.07 / 0.056}, g
assert g["resnet18"] == {"cuda_graph": "failed", "op_by_op_median_step_s": None, "graph_median_step_s": 0.025}, g
print("report ok")
PY
grep -q "resnet50 bf16 CUDA graph on: median step 0.0700 s op by op, 0.0560 s replayed | speedup 1.250" "$work/out.txt"
grep -q "resnet18 bf16 CUDA graph failed: median step - s op by op, 0.0250 s replayed | speedup -" "$work/out.txt"
grep -q "resnet50  ringtrain 5120 img/s" "$work/out.txt"
grep -q "resnet50 fp16 ringtrain 2530 img/s (median step 0.1012 s, profiled step 105.0 ms) | PyTorch 5753 img/s (median step 0.0445 s) | ratio 0.440" "$work/out.txt"
grep -q "resnet50 fp32 ringtrain - img/s .* PyTorch 3114 img/s" "$work/out.txt"
grep -q "resnet50 bf16, GPU ms a step by family: ringtrain (--profile, step 83.1 ms) | PyTorch (torch.profiler, step 55.9 ms)" "$work/out.txt"
grep -Eq "^  elementwise +26.20 +9.70 +2.70$" "$work/out.txt"
grep -Eq "^  gemm +- +0.02 +-$" "$work/out.txt"
grep -Eq "^  all +33.90 +15.52 +2.18$" "$work/out.txt"

# A dry run: none of the runs' files, none of their entries.
mkdir -p "$work/dry_w" "$work/dry_r"
python3 "$repo/scripts/gpu_check_report.py" "$work/facts" "$work/dry_w" "$work/dry_r" dry > "$work/out.txt"
python3 - "$work/dry_r/gpu_check.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
for key in ("training", "goals", "profile_resnet50_bf16", "precisions_resnet50", "tests"):
    assert key not in r, (key, r)
PY

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
