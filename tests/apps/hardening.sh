#!/usr/bin/env bash
# tests/apps/hardening.sh BUILD_DIR WORK_DIR [CASE...]: a resume or restart must never train the wrong
# thing, and no bad input passes quietly. Each case runs the programs as a user would and checks the
# message (docs/VALIDATION.md lists them all):
#   folder       a new run refuses a folder of another run's checkpoints (naming the run), --resume auto
#                continues it, --start-over moves them into a set-aside folder; a second explicit resume
#                never overwrites what the first set aside
#   writers      a second run on a folder another live run writes is refused naming its pid; once that run
#                is killed its lock is taken over, saying so
#   changes      a resume with another --seed, --nesterov or an app's augmentation flag says so, old and new
#   content      checkpoints without a checksum checked as strictly: NaN weights, a negative running
#                variance, a missing momentum, a step
#                past the run's end, a step its sampler position contradicts
#   data         damaged or stray input is not taken quietly: a PNG whose data overruns its header, a JPEG
#                with corrupt entropy data (counted per split when converting and training, refused with
#                --strict), shard files the manifest does not list; the doctor decodes records and fails on
#                one that decodes to another shape than /shapes says
#   early        errors at the start, not the end: a folder too deep for the run's file names,
#                --lr-milestones without multistep, a fault for a rank the job lacks, a FIFO as manifest
#                or log, a folder given to --resume, ringtrain_run with an unwritable --log-jsonl, SIGTERM
#                during --restart-delay
#   outputs      two outputs that are one file (the same path, a symbolic or a hard link), an output that is
#                the checkpoint folder or one of its files, a file named like a checkpoint whose step is not
#                a number, is missing or is spelled in another case (refused by --resume auto and by a new
#                run, not skipped); a full disk at the lock
#                says so and leaves no temporary file
#   inputs       no output lands on what the run reads or writes, whoever named it: --data's shards and
#                manifest, --link-calibration, another run's checkpoint, a file a dangling link leads to,
#                ringtrain_run's log against the job's files, ringtrain_plan's --save-link, make_shards' OUT
#                inside its SRC
#   modes        every option takes effect in the mode it is given in or is refused naming the mode:
#                --max-memory with --pipeline-stages, GPU flags with --device cpu, --start-over with
#                --resume FILE, ringtrain_env --once without --watch, --threads and --loader-threads (and
#                bench_loader --threads) beyond the cores;
#                --max-memory's bad values are usage errors, never an abort; --momentum/--nesterov with
#                AdamW, --lr-gamma with cosine, --lr-step-epochs outside step, --nesterov without momentum
#   environment  RINGTRAIN_* variables (docs/ENVIRONMENT.md): a switch spelled other than 1 or 0, a thread
#                count that is not a number in range, a fault past the run's end, refused naming the variable;
#                a named NVML library that does not load is said; RINGTRAIN_THREADS applies
#   memory       out of memory, each program names its own flags (not a batch size it lacks); a synthetic
#                set larger than the free disk is refused before its first byte
#   fulldisk     every writer (allreduce_bench --json, --trace, ringtrain_run --log-jsonl) fails on a full disk
set -euo pipefail
build=$(cd "$1" && pwd)
work=$2
shift 2
cases=("$@")
((${#cases[@]})) || cases=(folder writers changes content data early outputs inputs modes environment memory fulldisk)
rm -rf "$work"
mkdir -p "$work"
cd "$work"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fail() {
  echo "hardening test: FAIL: $*"
  exit 1
}
expect() {  # expect FILE REGEX WHAT: FILE holds REGEX, else fail printing it
  grep -Eq -- "$2" "$1" || {
    cat "$1"
    fail "$3: no '$2'"
  }
}
"$build/make_shards" synthetic data --shape 12x12x3 --count 400 --classes 5 --shards 2 > /dev/null 2>&1
train=(timeout -k 5 120 "$build/train_resnet" --data data -a resnet20 -b 8 --lr 0.05 --threads 1 --log-every 100)
# h5 FILE PYTHON: edits a checkpoint with h5py (as a damaged or hand-edited file would be) and drops its
# checksum, so it reads as a file written before checksums existed.
h5() {
  /usr/bin/python3 - "$1" "$2" << 'PY'
import h5py, json, numpy, sys
f = h5py.File(sys.argv[1], "r+")
exec(sys.argv[2])
if "checksum" in f.attrs: del f.attrs["checksum"]
f.close()
PY
}

for case in "${cases[@]}"; do
  case $case in
    folder)
      "${train[@]}" --steps 4 --checkpoint-every 2 --checkpoint-dir f > a.log 2>&1 || { cat a.log; fail "folder: run A"; }
      run=$(/usr/bin/python3 -c "import h5py, json; print(json.loads(h5py.File('f/ckpt-step00000004.h5')['meta/json'][()])['run_id'])")
      if "${train[@]}" --steps 4 --checkpoint-dir f > b.log 2>&1; then fail "folder: a new run wrote into run A's folder"; fi
      expect b.log "--checkpoint-dir 'f' holds checkpoints of another run: run $run \(steps 2-4, 2 files\)" folder
      expect b.log "continue that run with --resume auto, pass --start-over" folder
      "${train[@]}" --steps 6 --checkpoint-every 2 --checkpoint-dir f --resume auto > c.log 2>&1 || { cat c.log; fail "folder: --resume auto"; }
      expect c.log "resumed from f/ckpt-step00000004.h5: step 4" folder
      [[ -f f/ckpt-step00000006.h5 ]] || fail "folder: the continued run wrote no step 6"
      "${train[@]}" --steps 2 --checkpoint-dir f --start-over > d.log 2>&1 || { cat d.log; fail "folder: --start-over"; }
      expect d.log "--start-over: moved run $run \(steps 2-6, 3 files\) into f/set-aside-[0-9]{8}-[0-9]{6}" folder
      aside=$(ls -d f/set-aside-*)
      [[ -f $aside/ckpt-step00000006.h5 && -f f/ckpt-step00000002.h5 ]] || fail "folder: the old files were not kept aside"
      # Three explicit resumes from step 2, each writing step 4 again: the second sets the first's step 4
      # aside, the third the second's, under a name of its own.
      for n in 1 2 3; do
        "${train[@]}" --steps 4 --checkpoint-every 2 --checkpoint-dir f --resume f/ckpt-step00000002.h5 > e$n.log 2>&1 ||
          { cat e$n.log; fail "folder: explicit resume $n"; }
      done
      [[ -f f/ckpt-step00000004.h5.superseded && -f f/ckpt-step00000004.h5.superseded-2 ]] ||
        { ls f; fail "folder: a file set aside was overwritten"; }
      expect e3.log "set aside f/ckpt-step00000004.h5.superseded-2" folder
      echo "folder: another run's folder refused, continued with --resume auto, set aside with --start-over"
      ;;
    writers)
      "${train[@]}" --steps 100000 --checkpoint-dir w > w1.log 2>&1 &
      first=$!
      for _ in $(seq 300); do [[ -f w/.ringtrain-lock ]] && break; sleep 0.1; done
      [[ -f w/.ringtrain-lock ]] || { kill $first; cat w1.log; fail "writers: the first run took no lock"; }
      holder=$(pgrep -f -n "train_resnet .*--checkpoint-dir w" || true)
      if "${train[@]}" --steps 2 --checkpoint-dir w --resume auto > w2.log 2>&1; then
        kill $first
        fail "writers: a second live writer was let in"
      fi
      # The holder dies after its first checkpoint (on a loaded machine the refusal can come before it).
      for _ in $(seq 600); do compgen -G "w/ckpt-step*.h5" > /dev/null && break; sleep 0.1; done
      kill -9 "$holder" 2> /dev/null || true
      wait $first 2> /dev/null || true
      expect w2.log "--checkpoint-dir 'w' is in use by another run: pid [0-9]+ on host $(hostname)" writers
      last=$(ls w/ckpt-step*.h5 | tail -1 | sed 's/.*step0*//; s/\.h5//')
      "${train[@]}" --steps $((last + 2)) --checkpoint-dir w --resume auto > w3.log 2>&1 ||
        { cat w3.log; fail "writers: after the holder died"; }
      expect w3.log "took over the lock of 'w' from pid [0-9]+ on host .*no longer runs" writers
      [[ ! -f w/.ringtrain-lock ]] || fail "writers: the lock outlived its run"
      echo "writers: a second live writer refused naming the holder; a dead holder's lock taken over"
      ;;
    changes)
      "${train[@]}" --steps 2 --checkpoint-every 1 --checkpoint-dir s > s0.log 2>&1 || { cat s0.log; fail "changes: base run"; }
      "${train[@]}" --steps 2 --checkpoint-dir s2 --resume s/ckpt-step00000001.h5 --seed 1 --nesterov --no-hflip \
        > s1.log 2>&1 || { cat s1.log; fail "changes: the resume"; }
      for want in "--seed 0 -> 1" "--nesterov off -> on" "--no-hflip off -> on"; do
        expect s1.log "warning: resuming s/ckpt-step00000001.h5 with other flags than it was written with \(.*$want" changes
      done
      "${train[@]}" --steps 2 --checkpoint-dir s3 --resume s/ckpt-step00000001.h5 --threads 2 > s2.log 2>&1 ||
        { cat s2.log; fail "changes: a resume with another --threads"; }
      grep -q "other flags" s2.log && fail "changes: a runtime-only flag was reported as a change"
      echo "changes: another --seed, --nesterov and --no-hflip are said, --threads is not"
      ;;
    content)
      "${train[@]}" --steps 4 --checkpoint-every 2 --checkpoint-dir k > k0.log 2>&1 || { cat k0.log; fail "content: base run"; }
      resume_error() {  # resume_error NAME EDIT REGEX
        cp k/ckpt-step00000002.h5 "$1.h5"
        h5 "$1.h5" "$2"
        if "${train[@]}" --steps 4 --checkpoint-dir "k-$1" --resume "$1.h5" > "$1.log" 2>&1; then
          fail "content: $1: the damaged checkpoint was accepted"
        fi
        expect "$1.log" "$3" "content: $1"
      }
      resume_error nan 'd = f["model/fc.weight"]; v = d[()]; v[0, 0] = float("nan"); d[...] = v' \
        "--resume nan.h5: /model/fc.weight holds NaN or infinite values \(a file without a checksum, checked as strictly\)"
      resume_error nomomentum 'del f["optimizer/fc.weight.momentum"]' \
        "--resume nomomentum.h5: /optimizer has no 'fc.weight.momentum' after 2 step\(s\)"
      resume_error farstep \
        'm = json.loads(f["meta/json"][()]); m["step"] = 10**12; s = json.dumps(m); del f["meta/json"]; f["meta/json"] = numpy.bytes_(s)' \
        "--resume farstep.h5: the checkpoint is at step 1000000000000, past the end of this run \(4 steps\)"
      resume_error farepoch \
        'm = json.loads(f["meta/json"][()]); m["sampler"]["epoch"] = 3; m["epoch"] = 3; s = json.dumps(m); del f["meta/json"]; f["meta/json"] = numpy.bytes_(s)' \
        "--resume farepoch.h5: /meta/json says step 2 but its sampler position \(epoch 3, batch 2\) is step [0-9]+ of this run"
      resume_error negvar \
        'k = [n for n in f["model"].keys() if n.endswith("running_var")][0]; d = f["model/" + k]; v = d[()]; v[0] = -1; d[...] = v' \
        "--resume negvar.h5: /model/.*running_var holds negative values \(a file without a checksum, checked as strictly\): a variance is never negative"
      echo "content: NaN weights, a negative running variance, a missing momentum, a far step and a contradicted step are refused"
      ;;
    data)
      mkdir -p imgs/a imgs/b
      /usr/bin/python3 - << 'PY'
import io, struct, zlib
import numpy as np
from PIL import Image
rng = np.random.default_rng(0)
def jpeg():
    buf = io.BytesIO()
    Image.fromarray((rng.random((48, 40, 3)) * 255).astype("uint8")).save(buf, "JPEG", quality=90)
    return bytearray(buf.getvalue())
for cls in "ab":
    for i in range(6):
        open(f"imgs/{cls}/{i}.jpg", "wb").write(bytes(jpeg()))
b = jpeg()
sos = b.find(b"\xff\xda")
at = sos + (len(b) - sos) // 10  # early in the scan: every crop decodes past it
open("imgs/a/damaged.jpg", "wb").write(bytes(b[:at]) + b"\xff\xd3" + bytes(b[at:]))
def chunk(t, d): return struct.pack(">I", len(d)) + t + d + struct.pack(">I", zlib.crc32(t + d) & 0xffffffff)
raw = b"".join(b"\x00" + bytes(48) for _ in range(32))  # 32 rows of 16 RGB pixels
png = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", 16, 16, 8, 2, 0, 0, 0)) + \
      chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b"")
open("overrun.png", "wb").write(png)
PY
      "$build/make_shards" imagefolder imgs jd --size 0 --encode jpeg > mk.log 2>&1 || { cat mk.log; fail "data: conversion"; }
      expect mk.log "split 'train': 1 image\(s\) decoded with libjpeg warnings .*imgs/a/damaged.jpg: Corrupt JPEG data" data
      if "$build/make_shards" imagefolder imgs jd-strict --size 0 --encode jpeg --strict > mks.log 2>&1; then
        fail "data: make_shards --strict took a damaged JPEG"
      fi
      expect mks.log "image '.*damaged.jpg': libjpeg: Corrupt JPEG data.*--strict refuses such images" data
      mkdir -p pngs/a && cp overrun.png pngs/a/
      if "$build/make_shards" imagefolder pngs pd --size 16 > png.log 2>&1; then fail "data: a PNG overrunning its header"; fi
      expect png.log "image 'pngs/a/overrun.png': corrupt PNG data: IDAT: Too much image data: the image data disagrees with the 16x16 its header gives" data
      "${train[@]}" --data jd --image-size 24 --steps 1 > jt.log 2>&1 || { cat jt.log; fail "data: training on the damaged JPEG"; }
      expect jt.log "warning: rank 0, epoch 1: split 'train': 1 record\(s\) decoded with libjpeg warnings .*Corrupt JPEG data" data
      if "${train[@]}" --data jd --image-size 24 --steps 1 --strict > js.log 2>&1; then fail "data: --strict trained on it"; fi
      expect js.log "libjpeg: Corrupt JPEG data.*--strict refuses such records" data
      # A shard file the manifest does not list (left from another conversion) is said, not read in silence.
      cp -r data stray && cp stray/train-00000-of-00002.h5 stray/val-00000-of-00001.h5
      "${train[@]}" --data stray --steps 1 > stray.log 2>&1 || { cat stray.log; fail "data: training beside a stray shard"; }
      expect stray.log "1 shard file\(s\) that manifest.json does not list are not read \(val-00000-of-00001.h5\)" data
      # The doctor decodes: a record whose /shapes row lies passes validation, fails the doctor (as at batch 0).
      /usr/bin/python3 - << 'PY'
import h5py, json, zlib
f = h5py.File("jd/train-00000-of-00001.h5", "r+")
s = f["shapes"][()]
s[0, 0] += 1
f["shapes"][...] = s
f.close()
m = json.load(open("jd/manifest.json"))
crc = zlib.crc32(open("jd/train-00000-of-00001.h5", "rb").read()) & 0xffffffff
for split in m["splits"].values():
    for shard in split["shards"]:
        if shard["file"] == "train-00000-of-00001.h5": shard["crc32"] = f"{crc:08x}"
json.dump(m, open("jd/manifest.json", "w"))
PY
      if timeout 120 "$build/ringtrain_env" --data jd > env.log 2>&1; then cat env.log; fail "data: the doctor passed a lying /shapes"; fi
      expect env.log "FAIL data jd" data
      expect env.log "record 0: decodes to 48x40x3, but its /shapes row says 49x40x3" data
      echo "data: damaged JPEGs counted and refused with --strict, an overrunning PNG refused, stray shards said, the doctor decodes"
      ;;
    early)
      deep=$work/$(printf 'd%.0s' $(seq 200))
      # Exactly 4,070 characters whatever the length of $work (stopping at 4,040 left 4,040 to 4,070, and at
      # 4,052 or fewer the run's longest name, 43 characters, still fit under PATH_MAX): the folder itself fits,
      # the names the run writes there do not.
      while ((${#deep} < 4070)); do deep=$deep/$(printf 'd%.0s' $(seq 200)); done
      deep=${deep:0:4070}
      if mkdir -p "$deep" 2> /dev/null; then
        if "${train[@]}" --steps 2 --checkpoint-dir "$deep" > deep.log 2>&1; then fail "early: a too-deep folder passed"; fi
        expect deep.log "is too deep: the names this run writes there" early
      fi
      if "${train[@]}" --steps 2 --lr-milestones 1,2 > ms.log 2>&1; then fail "early: --lr-milestones without multistep"; fi
      expect ms.log "--lr-milestones 1,2 applies to --lr-schedule multistep only, but the schedule is cosine" early
      # A check's place is named in the source tree, not by the build machine's absolute path.
      expect ms.log "\[check .* at runtime/config/options.cpp:[0-9]+\]" early
      grep -q "at /.*runtime/config/options.cpp" ms.log && fail "early: a check's place is an absolute build path"
      if RINGTRAIN_INJECT=throw:5:1 "${train[@]}" --steps 2 > inj.log 2>&1; then fail "early: a fault for rank 5 of 1"; fi
      expect inj.log "RINGTRAIN_INJECT: rank 5 does not exist: this job has 1 rank\(s\)" early
      cp -r data fifo-data && rm fifo-data/manifest.json && mkfifo fifo-data/manifest.json
      if timeout 30 "${train[@]}" --steps 2 --data fifo-data > fifo.log 2>&1; then fail "early: a FIFO manifest"; fi
      expect fifo.log "manifest 'fifo-data/manifest.json' is a FIFO \(named pipe\), not a regular file" early
      mkfifo log.fifo
      if timeout 30 "${train[@]}" --steps 2 --log-jsonl log.fifo > lf.log 2>&1; then fail "early: a FIFO log"; fi
      expect lf.log "--log-jsonl 'log.fifo' is a FIFO \(named pipe\), not a regular file" early
      mkdir -p not-a-file
      if "${train[@]}" --steps 2 --resume not-a-file > rf.log 2>&1; then fail "early: a folder as --resume"; fi
      expect rf.log "checkpoint 'not-a-file' is a folder, not a checkpoint file \(to continue the newest checkpoint of a folder: --checkpoint-dir not-a-file --resume auto\)" early
      if timeout 60 "$build/ringtrain_run" --np 1 --log-jsonl /nonexistent/run.jsonl -- "${train[@]:4}" --steps 2 \
        --checkpoint-dir r > rl.log 2>&1; then fail "early: ringtrain_run with an unwritable --log-jsonl"; fi
      expect rl.log "--log-jsonl: cannot append to '/nonexistent/run.jsonl': .*\(its folder does not exist\)" early
      grep -q "launching" rl.log && fail "early: ringtrain_run launched before checking its log"
      # SIGTERM during a long --restart-delay ends the supervisor at once.
      start=$(date +%s)
      RINGTRAIN_INJECT=throw:0:1 timeout -k 5 100 "$build/ringtrain_run" --np 1 --restart-delay 600 -- "${train[@]:4}" \
        --steps 4 --checkpoint-dir rd > rd.log 2>&1 &
      sup=$!
      for _ in $(seq 300); do grep -q "restart 1 of" rd.log && break; sleep 0.1; done
      kill -TERM $sup
      wait $sup || true
      (($(date +%s) - start < 60)) || fail "early: SIGTERM waited out --restart-delay"
      expect rd.log "stopped by signal 15 .*before the relaunch; not restarting" early
      # A full disk is said first, not at the end of HDF5's error chain (root: a 1 MiB tmpfs).
      if [[ $(id -u) -eq 0 ]] && mkdir -p full && mount -t tmpfs -o size=1M tmpfs full 2> /dev/null; then
        trap 'umount "$work/full" 2> /dev/null || true' EXIT
        "${train[@]}" --steps 1 --checkpoint-dir full/ck > full.log 2>&1 && { umount full; fail "early: a full disk passed"; }
        umount full
        trap - EXIT
        expect full.log "checkpoint 'full/ck/ckpt-step00000001.h5': no space left on the device of 'full/ck' \([0-9]+ bytes free, about [0-9]+ needed\): free space or write elsewhere" early
      fi
      echo "early: each refused at the start, naming what is wrong"
      ;;
    outputs)
      for pair in "--log-jsonl o.json --trace o.json" "--log-jsonl o.json --trace ./sub/../o.json"; do
        mkdir -p sub
        if "${train[@]}" --steps 1 $pair > same.log 2>&1; then fail "outputs: $pair accepted"; fi
        expect same.log "are the same file: each output needs a file of its own" outputs
      done
      [[ ! -e o.json ]] || fail "outputs: a refused run wrote o.json"
      echo "{}" > kept.json && ln -s kept.json soft.json && ln kept.json hard.json
      for other in soft.json hard.json; do
        if "${train[@]}" --steps 1 --log-jsonl kept.json --trace $other > link.log 2>&1; then
          fail "outputs: --trace $other, a link to --log-jsonl, accepted"
        fi
        expect link.log "--log-jsonl 'kept.json' and --trace '$other' are the same file" outputs
      done
      [[ $(cat kept.json) == "{}" ]] || fail "outputs: a refused run changed kept.json"
      if "${train[@]}" --steps 1 --checkpoint-dir ck --log-jsonl ck/ckpt-step00000001.h5 > ck.log 2>&1; then
        fail "outputs: a log named like a checkpoint in the checkpoint folder"
      fi
      expect ck.log "--log-jsonl 'ck/ckpt-step00000001.h5' is named like one of --checkpoint-dir's own files" outputs
      if "${train[@]}" --steps 1 --checkpoint-dir ck --trace ck > ckd.log 2>&1; then fail "outputs: --trace the folder"; fi
      expect ckd.log "--trace 'ck' is the --checkpoint-dir folder itself" outputs
      # A file named like a checkpoint whose step is not a number is named, by a resume and a new run alike.
      "${train[@]}" --steps 2 --checkpoint-dir big > big0.log 2>&1 || { cat big0.log; fail "outputs: base run"; }
      cp big/ckpt-step00000002.h5 big/ckpt-step99999999999999999999.h5
      for extra in "--resume auto" ""; do
        if "${train[@]}" --steps 4 --checkpoint-dir big $extra > big.log 2>&1; then
          fail "outputs: '$extra' passed over ckpt-step99999999999999999999.h5"
        fi
        expect big.log "'big/ckpt-step99999999999999999999.h5' is named like a checkpoint, but '99999999999999999999' is not a step" outputs
      done
      # Another run's checkpoint under a name without a step, or in another case, is said too.
      for name in ckpt-step.h5 CKPT-STEP00000002.H5; do
        mkdir -p stray && cp big/ckpt-step00000002.h5 "stray/$name"
        for extra in "--resume auto" ""; do
          if "${train[@]}" --steps 2 --checkpoint-dir stray $extra > stray.log 2>&1; then
            fail "outputs: '$extra' passed over stray/$name"
          fi
          expect stray.log "'stray/$name' is named like a checkpoint, but (carries no step|not spelled as ringtrain)" outputs
        done
        [[ $(ls stray) == "$name" ]] || fail "outputs: a run wrote beside stray/$name: $(ls stray)"
        rm -rf stray
      done
      # A full disk when the lock is written: the reason, and no temporary file left behind.
      if [[ $(id -u) -eq 0 ]] && mkdir -p tiny && mount -t tmpfs -o size=64K tmpfs tiny 2> /dev/null; then
        trap 'umount "$work/tiny" 2> /dev/null || true' EXIT
        mkdir -p tiny/ck
        head -c 1M /dev/zero > tiny/filler 2> /dev/null || true
        "${train[@]}" --steps 1 --checkpoint-dir tiny/ck > tiny.log 2>&1 && { umount tiny; fail "outputs: a full disk passed"; }
        leftovers=$(ls -A tiny/ck)
        umount tiny
        trap - EXIT
        expect tiny.log "cannot write the lock file '.*': no space left on the device of 'tiny/ck'" outputs
        [[ -z $leftovers ]] || fail "outputs: a full disk left '$leftovers' in the folder"
      fi
      echo "outputs: aliases refused, the folder's own names kept, an unreadable checkpoint name said, a full disk said"
      ;;
    inputs)
      # No program writes onto what its run reads or writes, whoever named it: a shard or the manifest of
      # --data, the --link-calibration file, another run's checkpoint, a file a link leads to (even one not
      # there yet), ringtrain_run's log against the job's files, ringtrain_plan's --save-link, make_shards'
      # output in its source. Each refused before anything is written, every file left as it was.
      "${train[@]}" --steps 1 --checkpoint-dir other > other.log 2>&1 || { cat other.log; fail "inputs: base run"; }
      echo '{"link": {}}' > cal.json
      mkdir -p o && ln -s b.json o/a.json
      sums() { cat data/* cal.json other/* | md5sum; }
      before=$(sums)
      refused() {  # refused REGEX COMMAND...: the command fails, saying REGEX, and changes nothing
        local want=$1
        shift
        if "$@" > in.log 2>&1; then fail "inputs: accepted: $*"; fi
        expect in.log "$want" inputs
        [[ $(sums) == "$before" ]] || fail "inputs: a refused run changed a file: $*"
        [[ ! -e o/b.json ]] || fail "inputs: a refused run wrote through the link: $*"
      }
      refused "--trace 'data/train-00000-of-00002.h5' lies in --data 'data', a folder the run reads" \
        "${train[@]}" --steps 1 --trace data/train-00000-of-00002.h5
      refused "--log-jsonl 'data/manifest.json' lies in --data 'data'" "${train[@]}" --steps 1 --log-jsonl data/manifest.json
      refused "--checkpoint-dir 'data/ck' lies in --data 'data'" "${train[@]}" --steps 1 --checkpoint-dir data/ck
      refused "--trace 'cal.json' is the file that --link-calibration 'cal.json' names, which the run reads" \
        "${train[@]}" --steps 1 --layout auto --link-calibration cal.json --trace cal.json
      refused "--trace 'other/ckpt-step00000001.h5' is an HDF5 file \(a checkpoint or a data shard\)" \
        "${train[@]}" --steps 1 --trace other/ckpt-step00000001.h5
      refused "--log-jsonl 'cal.json' exists and is not a JSON-lines log" "${train[@]}" --steps 1 --log-jsonl cal.json
      refused "--log-jsonl 'o/a.json' and --trace 'o/b.json' are the same file" \
        "${train[@]}" --steps 1 --log-jsonl o/a.json --trace o/b.json
      refused "the training command's --trace 'o/a.json' and --log-jsonl 'o/b.json' are the same file" \
        timeout 60 "$build/ringtrain_run" --np 1 --max-restarts 0 --log-jsonl o/b.json -- "${train[@]:4}" --steps 1 \
        --trace o/a.json
      refused "the training command's --trace 'data/x.json' lies in the training command's --data 'data'" \
        timeout 60 "$build/ringtrain_run" --np 1 --max-restarts 0 -- "${train[@]:4}" --steps 1 --trace data/x.json
      refused "--log-jsonl 'cal.json' is the file that the training command's --link-calibration 'cal.json' names" \
        timeout 60 "$build/ringtrain_run" --np 1 --max-restarts 0 --log-jsonl cal.json -- "${train[@]:4}" --steps 1 \
        --layout auto --link-calibration cal.json
      refused "--log-jsonl 'o/a.json' and --save-link 'o/b.json' are the same file" \
        timeout 60 "$build/ringtrain_plan" --data data -a resnet20 -b 8 --threads 1 --save-link o/b.json \
        --log-jsonl o/a.json
      refused "--profile-jsonl 'other/ckpt-step00000001.h5' is an HDF5 file" \
        timeout 60 "$build/bench_step" -a resnet20 -b 2 --hw 8 --steps 1 --warmup 0 --profile \
        --profile-jsonl other/ckpt-step00000001.h5
      refused "--json 'data/manifest.json' is an HDF5|--json 'data/test-00000-of-00001.h5' is an HDF5 file" \
        timeout 60 "$build/allreduce_bench" --max-bytes 64 --json data/test-00000-of-00001.h5
      refused "OUT 'data/shards' lies in SRC 'data', a folder the run reads" \
        "$build/make_shards" imagefolder data data/shards --size 8
      # What is allowed stays allowed: a log appended to by a second run, outputs beside the data, the restart
      # log that is the job's own.
      "${train[@]}" --steps 1 --log-jsonl run.jsonl --trace run.trace > ok1.log 2>&1 || { cat ok1.log; fail "inputs: a plain run"; }
      "${train[@]}" --steps 1 --log-jsonl run.jsonl > ok2.log 2>&1 || { cat ok2.log; fail "inputs: a second run on the log"; }
      timeout 60 "$build/ringtrain_run" --np 1 --max-restarts 0 --log-jsonl job.jsonl -- "${train[@]:4}" --steps 1 \
        --log-jsonl job.jsonl > ok3.log 2>&1 || { cat ok3.log; fail "inputs: ringtrain_run on the job's own log"; }
      echo "inputs: outputs onto the data, the calibration, a checkpoint, through links, across programs refused"
      ;;
    modes)
      if "${train[@]}" --steps 1 --max-memory 1M --pipeline-stages 2 > mm.log 2>&1; then fail "modes: --max-memory with stages"; fi
      expect mm.log "--max-memory 1.00 MiB does not apply with --pipeline-stages 2" modes
      for flag in "--gpus 0" "--allow-shared-gpu" "--wait-for-gpu 1"; do
        if "${train[@]}" --steps 1 --device cpu $flag > gpu.log 2>&1; then fail "modes: $flag with --device cpu"; fi
        expect gpu.log "${flag%% *} chooses GPUs, but --device cpu trains on the CPU" modes
      done
      "${train[@]}" --steps 2 --checkpoint-dir so > so0.log 2>&1 || { cat so0.log; fail "modes: base run"; }
      if "${train[@]}" --steps 2 --checkpoint-dir so --start-over --resume so/ckpt-step00000002.h5 > so.log 2>&1; then
        fail "modes: --start-over with --resume FILE"
      fi
      expect so.log "--start-over does not combine with --resume so/ckpt-step00000002.h5" modes
      if "$build/ringtrain_env" --once > once.log 2>&1; then fail "modes: ringtrain_env --once without --watch"; fi
      expect once.log "--once requires --watch" modes
      for value in abc -1 1e30 10XB 1g0 nan "" 0 0.5; do
        rc=0
        "${train[@]}" --steps 1 --max-memory="$value" > mem.log 2>&1 || rc=$?
        ((rc != 0 && rc != 134)) || { cat mem.log; fail "modes: --max-memory '$value' gave exit $rc"; }
        expect mem.log "^--max-memory: " modes
        grep -q "terminate called" mem.log && fail "modes: --max-memory '$value' aborted"
      done
      cores=$(nproc)
      if "${train[@]}" --steps 1 --threads $((17 * cores)) > thr.log 2>&1; then fail "modes: --threads $((17 * cores))"; fi
      expect thr.log "--threads $((17 * cores)): rank 0 on .* has $cores core\(s\) available; more than 16 threads per core" modes
      "${train[@]}" --steps 1 --threads $((cores + 1)) > thw.log 2>&1 || { cat thw.log; fail "modes: --threads cores+1"; }
      expect thw.log "warning: --threads $((cores + 1)) is more than the $cores core\(s\) available" modes
      # Loader threads follow the same rule: refused beyond 16 a core, said beyond the cores.
      lt=$((17 * cores))
      if ((lt <= 1024)); then
        if "${train[@]}" --steps 1 --loader-threads $lt > lth.log 2>&1; then fail "modes: --loader-threads $lt"; fi
        expect lth.log "--loader-threads $lt: this process has $cores core\(s\) available; more than 16 loader threads per core" modes
        if timeout 60 "$build/bench_loader" --data data --threads 1,$lt --batches 1 --repeats 1 > blt.log 2>&1; then
          fail "modes: bench_loader --threads 1,$lt"
        fi
        expect blt.log "--threads $lt: this process has $cores core\(s\) available" modes
      fi
      "${train[@]}" --steps 1 --loader-threads $((cores + 1)) > ltw.log 2>&1 || { cat ltw.log; fail "modes: --loader-threads cores+1"; }
      expect ltw.log "--loader-threads $((cores + 1)) is more than the $cores core\(s\) available to this rank" modes
      # Training flags that do nothing in the chosen mode are refused naming it (they ran the baseline before).
      for args in "--optimizer adamw --momentum 0.5|--momentum 0.5 applies to --optimizer sgd only, but the optimizer is adamw" \
        "--optimizer adamw --nesterov|--nesterov applies to --optimizer sgd only, but the optimizer is adamw" \
        "--lr-gamma 0.5|--lr-gamma 0.5 applies to --lr-schedule step or multistep, but the schedule is cosine" \
        "--lr-schedule multistep --lr-step-epochs 3|--lr-step-epochs 3 applies to --lr-schedule step only, but the schedule is multistep" \
        "--nesterov --momentum 0|--nesterov needs a --momentum above 0, got 0"; do
        # shellcheck disable=SC2086
        if "${train[@]}" --steps 1 ${args%%|*} > noeffect.log 2>&1; then cat noeffect.log; fail "modes: ${args%%|*} ran"; fi
        expect noeffect.log "${args#*|}" modes
      done
      "${train[@]}" --steps 1 --lr-schedule step --lr-gamma 0.5 --lr-step-epochs 3 --nesterov > step.log 2>&1 ||
        { cat step.log; fail "modes: --lr-gamma and --lr-step-epochs with --lr-schedule step"; }
      echo "modes: each option applies where given or is refused naming the mode"
      ;;
    environment)
      # Every RINGTRAIN_* variable read one way (core/env.h, docs/ENVIRONMENT.md): a switch is 1 or 0, a number
      # follows the one number rule; the refusal names the variable and its value, before any step.
      train0=(timeout -k 5 120 "$build/train_resnet" --data data -a resnet20 -b 8 --lr 0.05 --log-every 100 --steps 1)
      env_refused() {  # env_refused ASSIGNMENT PATTERN ARGS...: the run with ASSIGNMENT fails naming PATTERN
        local assignment=$1 pattern=$2
        shift 2
        if env "$assignment" "${train0[@]}" "$@" > env.log 2>&1; then cat env.log; fail "environment: $assignment ran"; fi
        expect env.log "$pattern" "environment: $assignment"
        ! grep -q "terminate called" env.log || fail "environment: $assignment aborted"
      }
      for value in false no 00 " 0" true; do
        env_refused "RINGTRAIN_CUDA_GRAPH_EMULATE=$value" \
          "RINGTRAIN_CUDA_GRAPH_EMULATE='$value': expected 1 \(emulate CUDA graphs on the CPU, for tests\) or 0" \
          --cuda-graph --threads 1
      done
      env_refused "RINGTRAIN_MALLOC_DEFAULTS=yes" "RINGTRAIN_MALLOC_DEFAULTS='yes': expected 1" --threads 1
      for value in abc 1e9 99999999999 2000; do
        env_refused "RINGTRAIN_THREADS=$value" "RINGTRAIN_THREADS: expected an integer in \[0, 1024\], got '$value'"
      done
      env_refused "RINGTRAIN_THREADS=$((17 * $(nproc)))" \
        "RINGTRAIN_THREADS $((17 * $(nproc))): rank 0 on .* more than 16 threads per core"
      env_refused "RINGTRAIN_CPU_CONV=Direct" "RINGTRAIN_CPU_CONV='Direct' is not a CPU convolution choice" --threads 1
      env_refused "RINGTRAIN_RESTART=1x" "RINGTRAIN_RESTART: expected an integer in \[0, 1000000000\], got '1x'" --threads 1
      env_refused "RINGTRAIN_INJECT=throw:0:50" "RINGTRAIN_INJECT: step 50 is past this run's last step 1, so the fault would never fire" \
        --threads 1
      # A NVML library named but not loadable is said by the doctor, GPU or not (it was silent without one).
      RINGTRAIN_NVML_LIBRARY=/etc/hostname timeout -k 5 60 "$build/ringtrain_env" > nvml.log 2>&1 || true
      expect nvml.log "warning: gpus on .*: occupancy unknown \(NVML library '/etc/hostname' not loaded: .*RINGTRAIN_NVML_LIBRARY" \
        environment
      # README: RINGTRAIN_THREADS sets the thread count where --threads does not (it was ignored).
      more=$(($(nproc) + 1))
      RINGTRAIN_THREADS=$more "${train0[@]}" --log-jsonl env1.jsonl > env1.log 2>&1 ||
        { cat env1.log; fail "environment: RINGTRAIN_THREADS=$more"; }
      expect env1.log "warning: RINGTRAIN_THREADS $more is more than the $(nproc) core\(s\) available" environment
      /usr/bin/python3 -c "import json, sys; r = [json.loads(l) for l in open('env1.jsonl')]; \
t = [x['threads'] for x in r if 'threads' in x]; sys.exit(0 if t and t[0] == $more else 1)" ||
        fail "environment: RINGTRAIN_THREADS=$more did not set the thread count"
      echo "environment: switches are 1 or 0, numbers follow the rule, RINGTRAIN_THREADS takes effect"
      ;;
    memory)
      # An allocation that fails is said with what the program's own flags can do (the allocators state the
      # facts only): allreduce_bench has no batch size or loader, make_shards no images for synthetic data.
      if timeout -k 5 60 "$build/allreduce_bench" -b 1T -e 1T > oom.log 2>&1; then cat oom.log; fail "memory: a 1 TiB all-reduce ran"; fi
      expect oom.log "out of (host )?memory.*to use less memory: a smaller -e/--max-bytes" memory
      ! grep -Eq -- "batch|loader" oom.log || { cat oom.log; fail "memory: allreduce_bench was told of flags it lacks"; }
      if timeout -k 5 60 "$build/make_shards" synthetic oom --classes 1048576 --shape 2048x2048x3 > oom2.log 2>&1; then
        fail "memory: 12 TiB of class templates were made"
      fi
      expect oom2.log "make_shards: to use less memory: synthetic data keeps one template image per class: fewer --classes" memory
      ! grep -q "the images are too large" oom2.log || fail "memory: make_shards blamed the images"
      # A synthetic set the disk cannot hold is refused before the first byte (it ran until the disk refused).
      if timeout -k 5 60 "$build/make_shards" synthetic huge --count 4294967297 > huge.log 2>&1; then
        fail "memory: 13 TB of synthetic records were started"
      fi
      expect huge.log "make_shards: error: synthetic: 5153960756 records of 3.00 KiB need about .* free: lower --count" memory
      [[ ! -e huge ]] || fail "memory: the refused synthetic set left 'huge' behind"
      echo "memory: each program names its own flags when memory runs out; a set the disk cannot hold is refused"
      ;;
    fulldisk)
      # Every writer says a full disk and fails, naming its file: nothing left empty or short with exit 0
      # (root: a 64 KiB tmpfs, filled). allreduce_bench --json and ringtrain_run's --log-jsonl said nothing.
      if [[ $(id -u) -ne 0 ]] || ! { mkdir -p disk && mount -t tmpfs -o size=64K tmpfs disk 2> /dev/null; }; then
        echo "fulldisk: no tmpfs to fill here (needs root): skipped"
      else
        trap 'umount "$work/disk" 2> /dev/null || true' EXIT
        head -c 1M /dev/zero > disk/filler 2> /dev/null || true
        full_fails() {  # full_fails NAME PATTERN COMMAND...: COMMAND fails, naming PATTERN
          local name=$1 pattern=$2
          shift 2
          if "$@" > "$name.log" 2>&1; then cat "$name.log"; umount disk; fail "fulldisk: $name exited 0"; fi
          expect "$name.log" "$pattern" "fulldisk: $name"
        }
        full_fails json "--json: (cannot write|writing) 'disk/r.json'.*|no space left on the device of 'disk'" \
          timeout -k 5 60 "$build/allreduce_bench" -b 8 -e 64 --json disk/r.json
        full_fails trace "no space left on the device of 'disk' .*--trace" "${train[@]}" --steps 1 --trace disk/t.json
        full_fails run "ringtrain_run: error: .*--log-jsonl: writing 'disk/run.jsonl' failed.*record is lost" \
          timeout -k 5 120 "$build/ringtrain_run" --np 1 --max-restarts 0 --log-jsonl disk/run.jsonl -- "${train[@]:4}" --steps 1
        expect run.log "the job finished, but records of its log were lost" fulldisk
        umount disk
        trap - EXIT
        echo "fulldisk: allreduce_bench --json, --trace and ringtrain_run --log-jsonl fail naming a full disk"
      fi
      ;;
    *) fail "unknown case '$case'" ;;
  esac
done
echo "hardening test: PASS"
