#!/usr/bin/env bash
# Reproduce the GPU figures of docs/performance.md. From the repo root, with the package installed
# (`pip install -e '.[hf]'`, your CUDA torch) on a machine with two GPUs:
#
#   bash bench/device_all.sh [PART...]     # default: bench ddp pause check probe
#
#   bench  the trainer's micro-32 row between two HF+compile rows, one process a row on one GPU
#   ddp    one rank vs two ranks at the reference shape (micro 4 x accum 32, CUDA graphs) and at micro 32 x accum 4
#   scaling  the trainer itself at the reference shape, one rank then two: its RUN_JSON step figures as rows
#   pause  the 2-rank trainer at the reference shape, a push every 2 steps: the checkpoint pause vs a step
#   check  the 50-step fast-vs-plain loss check with the bf16 noise floor (micro 8)
#   probe  SPECPROBE_TARGET=gpu engine run specs/p4_smoke.yaml
#
# Rows (*.jsonl), logs/, summary.txt and the probe's run dir go under $OUT (default ./bench-out). DRY_RUN=1 prints the commands only.
# A CPU rehearsal of every part (tiny model, the probe on its local target; ~20 minutes on 2 cores):
#   DEV=cpu MODEL=tiny SEQ=64 VOCAB=512 MICRO=4 REF_MICRO=2 REF_ACCUM=2 CHECK_MICRO=2 PROBE_TARGET=local \
#     BENCH_EXTRA="--steps 2 --warmup 1" bash bench/device_all.sh
set -u -o pipefail
OUT=${OUT:-./bench-out}; PY=${PY:-python3}; ENGINE=${ENGINE:-engine}; PROBE_TARGET=${PROBE_TARGET:-gpu}
DRY_RUN=${DRY_RUN:-}
DEV=${DEV:-cuda}; MODEL=${MODEL:-ounce100m-22l}; SEQ=${SEQ:-1024}; VOCAB=${VOCAB:-49152}; NPROC=${NPROC:-2}
MICRO=${MICRO:-32}; REF_MICRO=${REF_MICRO:-4}; REF_ACCUM=${REF_ACCUM:-32}; CHECK_MICRO=${CHECK_MICRO:-8}
PREC=${PREC:-$([ "$DEV" = cuda ] && echo bf16 || echo fp32)}; BENCH_EXTRA=${BENCH_EXTRA:-}
SCALING_RANKS=${SCALING_RANKS:-1 $NPROC}; SCALING_STEPS=${SCALING_STEPS:-14}; SCALING_ATTN=${SCALING_ATTN:-sdpa}
MIX_TOKENS=${MIX_TOKENS:-8000000}; BENCH_GPU=${BENCH_GPU:-0}
PART_TIMEOUT=${PART_TIMEOUT:-0}   # seconds a part may run (0: no limit); the bench dumps its stacks on SIGTERM
PARTS=${*:-bench ddp scaling pause check probe}
# The figures were measured with NVLink SHARP multicast off; keep it off so they compare.
export NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0} OMP_NUM_THREADS=${OMP_NUM_THREADS:-4} PYTHONUNBUFFERED=1
# The trainer's cuda default: whole-model compile with Inductor's coordinate-descent tuning (+ CUDA graphs).
FULL=compile=full,ctune=1
HF=impl=hf,micro=$MICRO,compile=full,steps=40,warmup=10
OURS=impl=ours,micro=$MICRO,$FULL,steps=40,warmup=10
REF=impl=ours,micro=$REF_MICRO,accum=$REF_ACCUM,$FULL,cmode=reduce-overhead,steps=10,warmup=3
BIG=impl=ours,micro=$MICRO,accum=4,$FULL,steps=10,warmup=3
SUM=$OUT/summary.txt
say() { echo "$*" | tee -a "$SUM"; }
# cmd LOG ARGV...: print the command, then (unless DRY_RUN) run it with its output in $OUT/logs/LOG.
# Parts run under `set -e`: the first failed command ends its part.
cmd() { local log=$1 rc=0; shift; say "+ $*"; [ -n "$DRY_RUN" ] && return
  "$@" >>"$OUT/logs/$log" 2>&1 || { rc=$?; say "FAILED rc=$rc (see $OUT/logs/$log)"; return $rc; }; }
bench() { local tag=$1 gpu=$2; shift 2; local args=(); for c in "$@"; do args+=(--config "$c"); done
  cmd "$tag.log" env CUDA_VISIBLE_DEVICES="$gpu" "$PY" bench/train_bench.py --jsonl "$OUT/$tag.jsonl" \
    --verbose --device "$DEV" --model "$MODEL" --seq-len "$SEQ" $BENCH_EXTRA "${args[@]}"; }
bench_ranks() { local tag=$1; shift; local args=(); for c in "$@"; do args+=(--config "$c"); done
  cmd "$tag.log" "$PY" -m torch.distributed.run --nproc_per_node="$NPROC" bench/train_bench.py \
    --jsonl "$OUT/$tag.jsonl" --verbose --device "$DEV" --model "$MODEL" --seq-len "$SEQ" $BENCH_EXTRA "${args[@]}"; }

# One process a row: rows in one process drift apart by up to 20 % (compiled kernels rebuilt after a reset).
part_bench() { bench bench "$BENCH_GPU" "$HF"; bench bench "$BENCH_GPU" "$OURS"; bench bench "$BENCH_GPU" "$HF"; }
part_ddp() {
  bench ddp 0 "$REF"; bench_ranks ddp "$REF"
  bench ddp 0 "$BIG"; bench_ranks ddp "$BIG"
}
mix() { [ -f "$OUT/mix/manifest.json" ] || cmd mix.log "$PY" -m trainer.data.mix build --out "$OUT/mix" --synthetic \
    --tokens "$MIX_TOKENS" --val-tokens 300000 --vocab "$VOCAB"; }
# The trainer's own step (not the bench's copy of it), one process without DDP then $NPROC ranks under
# torchrun, nothing pushed before the horizon: RUN_JSON's tok_s_median and step_ms_* (trainer/steptime.py) become rows of the bench's table.
part_scaling() {
  local steps=$SCALING_STEPS tps1=$((REF_MICRO * REF_ACCUM * SEQ)) logs=() n
  mix
  for n in $SCALING_RANKS; do
    rm -rf "$OUT/scaling$n"
    local launch=("$PY"); [ "$n" = 1 ] || launch+=(-m torch.distributed.run --standalone --nproc_per_node="$n")
    cmd "scaling$n.log" env CUDA_VISIBLE_DEVICES="$(seq -s, 0 $((n - 1)))" "${launch[@]}" -m trainer.train --model "$MODEL" --device "$DEV" --root "$OUT/mix" \
      --out "$OUT/scaling$n/out" --hub-repo "file://$(cd "$OUT" && pwd)/scaling$n/store" --seq-len "$SEQ" \
      --attn "$SCALING_ATTN" --no-grad-ckpt --micro-batch "$REF_MICRO" --accum "$REF_ACCUM" \
      --tokens $((steps * n * tps1)) --push-every-steps "$steps" --val-tokens 0 --log-every "$steps" \
      --resume never --precision "$PREC"
    logs+=("$OUT/logs/scaling$n.log")
  done
  [ -n "$DRY_RUN" ] || "$PY" bench/train_bench.py --trainer-log "${logs[@]}" --jsonl "$OUT/scaling.jsonl" | tee -a "$SUM"
}
part_pause() {
  local out=$OUT/pause_run tps=$((NPROC * REF_MICRO * REF_ACCUM * SEQ))
  mix
  rm -rf "$out" "$OUT/pause_store"
  cmd pause.log "$PY" -m torch.distributed.run --nproc_per_node="$NPROC" -m trainer.train --model "$MODEL" \
    --device "$DEV" --root "$mix" --out "$out" --hub-repo "file://$(cd "$OUT" && pwd)/pause_store" --prune \
    --seq-len "$SEQ" --attn sdpa --no-grad-ckpt --micro-batch "$REF_MICRO" --accum "$REF_ACCUM" \
    --tokens $((8 * tps)) --lr 6e-4 --push-every-steps 2 --val-tokens "$tps" --log-every 1 --resume never \
    --precision "$PREC"
  [ -n "$DRY_RUN" ] && return
  grep -h 'CKPT save' "$OUT/logs/pause.log" | sed 's/^\[default0\]://; s/^/  /' | tee -a "$SUM"
  local runjson; runjson=$(grep -h 'RUN_JSON' "$OUT/logs/pause.log" | sed 's/^.*RUN_JSON //')
  [ -n "$runjson" ] || { say "pause: no RUN_JSON in $OUT/logs/pause.log"; return 1; }
  echo "$runjson" | "$PY" -c 'import json, sys
r = json.loads(sys.stdin.readline())
tok, pause, peak = r["tok_per_s"], r["ckpt_pause_s_max"], r["peak_gpu_gb_max_rank"]
step = r["tokens_per_step"] / tok
print(f"  pause max {1000 * pause:.1f} ms = {100 * pause / step:.2f} % of a {step:.3f} s step"
      f" ({tok:.0f} tok/s, step 1 excluded); peak allocated {peak} GiB a rank")' | tee -a "$SUM"
}
part_check() { bench check 0 "task=check,micro=$CHECK_MICRO,$FULL,steps=50,noise=1"; }
part_probe() {
  rm -rf "$OUT/probe_run"
  local rc=0
  cmd probe.log env SPECPROBE_TARGET="$PROBE_TARGET" "$ENGINE" run specs/p4_smoke.yaml --run-dir "$OUT/probe_run" || rc=$?
  [ -n "$DRY_RUN" ] || tail -1 "$OUT/logs/probe.log" | tee -a "$SUM"
  return $rc
}
# The bench exits 0 when a row fails (the row carries the error): a part fails on any such row, or on none.
rows_ok() {
  [ -f "$1" ] || { say "no rows in $1"; return 1; }
  "$PY" -c 'import json, sys
rows = [json.loads(line) for line in open(sys.argv[1]) if line.strip()]
bad = [r.get("config") for r in rows if r.get("error")]
measured = [r for r in rows if "info" not in r]
sys.exit(f"failed rows in {sys.argv[1]}: {bad}" if bad else None if measured else f"no rows in {sys.argv[1]}")' \
    "$1" 2>&1 | tee -a "$SUM"
  return "${PIPESTATUS[0]}"
}

for part in $PARTS; do
  declare -F "part_$part" >/dev/null || { echo "unknown part '$part' (bench ddp scaling pause check probe)" >&2; exit 2; }
done
mkdir -p "$OUT/logs"
say "device_all.sh [$PARTS] $(date -u +%FT%TZ) out=$OUT"
[ -n "$DRY_RUN" ] || { command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=index,name,memory.total,driver_version \
  --format=csv,noheader | tee -a "$SUM"
  "$PY" -c 'import sys, torch; print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda)' \
  | tee -a "$SUM"; }
failed=()
for part in $PARTS; do
  t=$(date +%s); say "=== $part"; rm -f "$OUT/$part.jsonl"   # --jsonl appends: this run's rows only
  export -f "part_$part" cmd bench bench_ranks say mix
  export OUT PY ENGINE PROBE_TARGET DRY_RUN DEV MODEL SEQ VOCAB PREC NPROC MICRO REF_MICRO REF_ACCUM CHECK_MICRO BENCH_EXTRA SUM
  export SCALING_RANKS SCALING_STEPS SCALING_ATTN MIX_TOKENS BENCH_GPU
  export FULL HF OURS REF BIG
  timeout --signal=TERM --kill-after=10 "$PART_TIMEOUT" bash -c "set -e; part_$part"; rc=$?
  case $part in bench|ddp|check|scaling) [ -n "$DRY_RUN" ] || rows_ok "$OUT/$part.jsonl" || rc=1;; esac
  say "=== $part rc=$rc in $(( $(date +%s) - t )) s"
  [ $rc = 0 ] || failed+=("$part")
done
[ -n "$DRY_RUN" ] && exit 0
rows=("$OUT"/*.jsonl); [ -e "${rows[0]}" ] && "$PY" bench/train_bench.py --table "${rows[@]}" | tee -a "$SUM"
[ ${#failed[@]} = 0 ] || { say "failed parts: ${failed[*]} (logs in $OUT/logs)"; exit 1; }
