#!/usr/bin/env bash
# Everything the GPU issues need from one device call on nvidia-h200-x2, each part under its own timeout
# so a slow part cannot eat the call. Usage (repo root, on the device; $OUT collects the results):
#
#   bash bench/device_all.sh [PART...]      # parts: bench ddp a b pause check nocomp
#                                           # (default: bench ddp a b, in that order)
#
#   bench  the side-by-side table on one GPU each: our trainer's model on GPU 0 (its cuda default first,
#          then regional-compile and eager rows) while transformers' LlamaForCausalLM runs on GPU 1 (same card
#          type, same call; they share only the host CPUs). ~8 minutes: give it a call of its own
#   ddp    2-rank scaling of the fast path (torchrun, NCCL) at the per-rank shapes the bench measured
#   a      trainer/train.py on 2 ranks at the frozen shape (micro 4, accum 32, seq 1024, no grad ckpt):
#          leg 1 stops at a push step, --out is wiped, leg 2 cold-resumes from the local store; bf16, then fp16
#   b      SPECPROBE_TARGET=gpu engine run specs/p4_smoke.yaml (evidence.json comes back)
#   pause  trainer/train.py, 2 ranks, the reference shape (micro 4, accum 32, seq 1024, frozen model, bf16,
#          compile at its default), 8 steps, a push every 2: ckpt_pause_s_max vs one step (async snapshot)
#   check  the same at accum 4 with SPECPROBE_SNAPSHOT_CHECK=1: the side stream sleeps 1 s before its copies,
#          so the next optimizer step must wait on the device; every snapshot is compared bitwise with a
#          blocking copy of the step's state (a torn copy would show as MISMATCH and exit 4)
#   nocomp the `pause` run with --no-compile (tok/s with vs without compile)
#   speed  (one GPU is enough: nvidia-h200) micro-32 speed levers side by side on GPU 0, alone: the default,
#          sdpa enable_gqa, loss chunks of 1024/8192 rows, the cuDNN sdpa backend, combinations, CUDA
#          graphs (reduce-overhead), a profile of the default, the default again (run-to-run spread), and
#          the 50-step fast-vs-plain check with the bf16 noise floor (plain fuse=1, plain fp32)
#   full   the same micro-32 row with torch.compile of the whole model instead of regional
#   autotune  regional compile with mode max-autotune-no-cudagraphs (its own budget: the autotuning)
#   speed5 (nvidia-h200) run 5: each micro-32 row in its own process, HF+compile / new / old / gqa
#          interleaved and repeated, then one lever off at a time and a profile (nvidia-smi dmon runs
#          alongside every part: clocks and power per second in dmon.log)
#   m4     micro 4: memory and speed of the new defaults, the old ones, enable_gqa
#   check5 50-step fast vs plain vs plain fp32 losses with the new defaults
#   speed6 (nvidia-h200) run 6: HF+compile, then the defaults after run 5 (gqa auto) and one lever each:
#          sdpa=flash, 8192/16384-row loss chunks, coordinate-descent tuning, whole-model compile
#   m4b    micro 4 x accum 32 (the trainer's shape: gradients live across micro-steps) and micro 4
#   autotune6  the defaults with mode max-autotune-no-cudagraphs (its own budget)
#   lean   (x2, GPU 0 alone) run 7: LEAN_ACTIVATIONS on vs off at micro 32 and micro 4 x accum 32, HF+compile,
#          and the 1-rank row of ddp7's shape
#   ddp7   2 ranks at micro 32 x accum 4 and micro 4 x accum 32 (gradients as bucket views)
#   pauselean0  the `pause` trainer run with SPECPROBE_LEAN_ACTIVATIONS=0
#   speed9 (nvidia-h200-x2) run 9: two lanes at once (GPU 0: fused q/k/v and gate/up; GPU 1: whole-model
#          compile with coordinate-descent tuning, with CUDA graphs, combo kernels),
#          each lane opened and closed by HF+compile and holding the defaults
#   speed10 (nvidia-h200-x2) run 10: GPU 0 the whole-model compile with kernel tuning (the new cuda default),
#          + CUDA graphs, + combo kernels; GPU 1 fp16 vs bf16, drift and fast-vs-plain at the new default
#   check10 the fast-vs-plain check at the new default again (after part pause in run 11)
#   speed12 (nvidia-h200-x2) run 12: combo kernels on the whole model (GPU 0, with a profile of the
#          default), CUDA graphs on it with and without combo kernels (GPU 1)
#   speed13 (nvidia-h200-x2) run 13: fp32 weight gradients (pbwd=fp32) with combo kernels, beside its
#          baseline; combo kernels with CUDA graphs (its grouped rows and check: see the part)
#   speed14 (nvidia-h200-x2) run 14: the new default beside run 12's, + CUDA graphs, at micro 4 x accum 32,
#          and its fast-vs-plain check
#   speed15 (nvidia-h200-x2) run 15: Programmatic Dependent Launch (Inductor's triton.enable_pdl) on the
#          run-14 default, alone (profiled) and with CUDA graphs; Inductor's fusion knobs
#   checkbisect run 18: the 50-step check of the run-14 default beside the same without combo kernels and
#          without the fp32 weight-gradient Function (the default's check did not finish in runs 16-17)
#   speed19 (nvidia-h200-x2) run 19: the candidates without combo kernels (run 18: they stall the compile at
#          micro 8): run 11's default, + fp32 weight gradients, + grouped input-gradient GEMMs; their checks
#   combo8 (nvidia-h200-x2) combo kernels at micro 8 and 16 (speed rows): is their stalled compile
#          micro 8's alone, and is it the coordinate-descent tuning or their own autotuning? (run 22)
#   combo22 (nvidia-h200-x2) combo kernels instead of coordinate-descent tuning, at micro 32 and 4 (run 25)
#   graphs27 (run 27, nvidia-h200-x2) CUDA graphs: the compiled path's gradients with and without them at micro 4 x
#          accum 4 (GPU 0; then the same with gradients set to None, cudagraph trees' known error, which
#          the check must catch), micro 32 with them beside HF (GPU 1), then the 2-rank trainer at the
#          reference shape with its new default (--cuda-graphs auto: on)
#   graphs28 (run 28, nvidia-h200-x2) the gradient check with its floor; the 2-rank trainer's pause with CUDA graphs
#          after the copies' enqueue moved to the push thread; micro 4 with CUDA graphs beside HF
#   check26 (run 26, nvidia-h200-x2) what run 25's candidate default needs before it is one: its 50-step check,
#          micro 4 with CUDA graphs and HF at micro 4, then the 2-rank trainer at the reference shape with it
#   ddpfull 2 ranks vs 1 rank at micro 32 x accum 4 with the cuda default (the whole-model compile)
#   ddp35  (nvidia-h200-x2) why 2 ranks at micro 4 x accum 32 with CUDA graphs are 1.75-1.82x one rank (runs 33-34):
#          1 rank, then 2 ranks as the trainer runs them (heap frozen after the warm-up), with Python's
#          collector left alone (gcfreeze=0), with one graph instead of DDPOptimizer's split (ddpopt=0),
#          and the default profiled (device time a step vs the step: host- or device-bound)
#   ocode  Inductor's output code of the regional block graphs at micro 32 (in logs.tgz)
#   ckpt   checkpoint write + push seconds vs bytes (bench/ckpt_bench.py, host only) at 5 sizes
#
# Budgets (seconds) can be overridden: T_BENCH T_DDP T_A T_B. Outputs under $OUT (8 files at most come
# back): summary.txt, bench.jsonl, evidence.json, logs.tgz (every log).
set -u
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
LOG=/tmp/specprobe_logs
# This call's logs only: a machine kept warm between calls still holds the last call's (already returned),
# and they would land in this call's logs.tgz and bench.jsonl (runs 23-24 carried run 22's that way).
rm -rf "$LOG" && mkdir -p "$LOG"
PARTS=${*:-bench ddp a b}
T_BENCH=${T_BENCH:-560}; T_DDP=${T_DDP:-75}; T_A=${T_A:-190}; T_B=${T_B:-220}
T_PAUSE=${T_PAUSE:-330}; T_CHECK=${T_CHECK:-50}; T_NOCOMP=${T_NOCOMP:-75}
T_SPEED=${T_SPEED:-160}; T_SPEED5=${T_SPEED5:-420}; T_M4=${T_M4:-90}; T_CHECK5=${T_CHECK5:-60}; T_SPEED6=${T_SPEED6:-330}; T_M4B=${T_M4B:-60}; T_AUTOTUNE6=${T_AUTOTUNE6:-150}; T_LEAN=${T_LEAN:-200}; T_DDP7=${T_DDP7:-90}; T_PAUSELEAN0=${T_PAUSELEAN0:-100}; T_SPEED9=${T_SPEED9:-480}; T_SPEED10=${T_SPEED10:-530}; T_CHECK10=${T_CHECK10:-560}; T_CHECKBISECT=${T_CHECKBISECT:-560}; T_SPEED12=${T_SPEED12:-540}; T_SPEED13=${T_SPEED13:-545}; T_SPEED14=${T_SPEED14:-500}; T_SPEED15=${T_SPEED15:-520}; T_SPEED19=${T_SPEED19:-520}; T_COMBO8=${T_COMBO8:-500}; T_COMBO22=${T_COMBO22:-360}; T_CHECK26=${T_CHECK26:-500}; T_GRAPHS27=${T_GRAPHS27:-520}; T_GRAPHS28=${T_GRAPHS28:-520}; T_DDP35=${T_DDP35:-520}; T_OCODE=${T_OCODE:-60}; T_FULL=${T_FULL:-75}; T_AUTOTUNE=${T_AUTOTUNE:-100}; T_CKPT=${T_CKPT:-45}
CKPT_LAYERS=${CKPT_LAYERS:--1 0 8 22 44}
PY=${PY:-python3}; SITE=${SITE:-/tmp/site}
# Knobs for a CPU rehearsal of this script (DEV=cpu MODEL=tiny SEQ=64 BENCH_EXTRA="--steps 2 --warmup 1").
DEV=${DEV:-cuda}; MODEL=${MODEL:-ounce100m-22l}; SEQ=${SEQ:-1024}; BENCH_EXTRA=${BENCH_EXTRA:-}
MICRO_A=${MICRO_A:-4}; ACCUM_A=${ACCUM_A:-32}; VOCAB_A=${VOCAB_A:-49152}
PREC_R=${PREC_R:-bf16}; STEPS_R=${STEPS_R:-8}; ACCUM_CHECK=${ACCUM_CHECK:-4}
export PYTHONUNBUFFERED=1 TORCH_CPP_LOG_LEVEL=WARNING OMP_NUM_THREADS=4
# NVLink multicast stays off (KINDS.md: it can take the host's shared GPUs down); set them again here
# so every child inherits them even if the image's profile did not.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
SUM="$OUT/summary.txt"
say() { echo "$*" | tee -a "$SUM"; }
T0=$(date +%s); touch "$LOG/.t0"   # what Inductor writes after this is this call's (see the end)
command -v nvidia-smi >/dev/null && { nvidia-smi dmon -s pc -d 1 >"$LOG/dmon.log" 2>&1 & }
say "device_all.sh parts=[$PARTS] start $(date -u +%FT%TZ)"
nvidia-smi --query-gpu=index,name,memory.total,driver_version,clocks.sm,power.draw --format=csv,noheader | tee -a "$SUM"
$PY -c 'import torch,sys; print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda, "gpus", torch.cuda.device_count())' 2>&1 | tee -a "$SUM"
$PY -c 'import transformers; print("transformers", transformers.__version__)' 2>&1 | tail -1 | tee -a "$SUM"

# The engine's two pure-Python deps the image lacks travel as wheels in .whl (carry it); the package's
# entry point (the `hub` collector plugin) needs a dist-info on the path, written here by hand because
# nothing can be fetched to build the package there.
if [ -d .whl ]; then
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target $SITE .whl/*.whl \
    >"$LOG/pip.log" 2>&1 || say "pip install of .whl failed (see logs)"
fi
mkdir -p $SITE/specprobe-0.1.0.dist-info
printf 'Metadata-Version: 2.1\nName: specprobe\nVersion: 0.1.0\n' >$SITE/specprobe-0.1.0.dist-info/METADATA
printf '[console_scripts]\nengine = engine.cli:main\n\n[specprobe.collectors]\nhub = trainer.collector:collect\n' \
  >$SITE/specprobe-0.1.0.dist-info/entry_points.txt
export PYTHONPATH="$PWD:$SITE${PYTHONPATH:+:$PYTHONPATH}"

# A carried Inductor cache from an earlier call (.ind_cache/ind_cache.tgz.*, what INDUCTOR_CACHE_OUT=1
# left in $OUT): same card and software there, so its compiled kernels and tuned configs are valid here.
IND_DIR=${TORCHINDUCTOR_CACHE_DIR:-/tmp/torchinductor_$(whoami)}
if ls .ind_cache/ind_cache.tgz.* >/dev/null 2>&1; then
  mkdir -p "$IND_DIR" && cat .ind_cache/ind_cache.tgz.* | tar -xzf - -C "$IND_DIR" \
    && say "inductor cache restored: $(du -sh "$IND_DIR" | cut -f1)" || say "inductor cache restore failed"
fi

part_bench() {
  # GPU 0: ours. Order = what the issue gates first, so a timeout costs the least important rows. The first
  # two rows are the trainer's cuda default (whole-model compile with kernel tuning; runs 9-15): the headline
  # ratio at micro 32 and the reference shape's memory and checkpoint stall; ~2.5 minutes of compile each in
  # a fresh process. The rest compile regionally (seconds), as the table had it before run 9.
  CUDA_VISIBLE_DEVICES=0 $PY bench/train_bench.py --jsonl "$LOG/bench_gpu0.jsonl" --verbose \
    --device $DEV --model $MODEL --seq-len $SEQ $BENCH_EXTRA \
    --config impl=ours,micro=32,compile=full,ctune=1,steps=40,warmup=10 \
    --config impl=ours,micro=4,accum=32,compile=full,ctune=1,steps=4,warmup=2,stall=1 \
    --config impl=ours,micro=32,compile=regional,steps=40,warmup=10 \
    --config impl=ours,micro=4,compile=regional,steps=60,warmup=10 \
    --config impl=ours,micro=32,compile=regional,prec=fp16,steps=60,warmup=20 \
    --config task=check,micro=8,compile=regional,steps=50 \
    --config impl=ours,micro=32,accum=4,compile=regional,steps=10,warmup=3 \
    --config impl=ours,micro=32,compile=regional,fuse=1,steps=30,warmup=8 \
    --config impl=ours,micro=32,compile=regional,ce=ckpt,steps=30,warmup=8 \
    --config impl=ours,micro=32,compile=regional,ce=fused_eager,steps=30,warmup=8 \
    --config impl=ours,micro=4,compile=none,steps=40,warmup=5 \
    --config impl=ours,micro=32,compile=none,steps=20,warmup=5 \
    --config impl=ours,micro=4,attn=eager,compile=none,steps=20,warmup=5 \
    --config task=drift,micro=8,compile=regional,warmup=10,windows=20/180/1000 \
    >"$LOG/bench_gpu0.log" 2>&1 &
  local p0=$!
  # GPU 1: the baseline as a user would run it (torch.compile of the whole model), then eager rows.
  CUDA_VISIBLE_DEVICES=1 $PY bench/train_bench.py --jsonl "$LOG/bench_gpu1.jsonl" --verbose \
    --device $DEV --model $MODEL --seq-len $SEQ $BENCH_EXTRA \
    --config impl=hf,micro=32,compile=full,steps=40,warmup=10 \
    --config impl=hf,micro=4,compile=none,steps=40,warmup=5 \
    --config impl=hf,micro=32,compile=none,steps=20,warmup=5 \
    --config impl=hf,micro=4,compile=full,steps=60,warmup=10 \
    --config impl=hf,micro=4,attn=eager,compile=none,steps=20,warmup=5 \
    --config impl=hf,micro=32,compile=regional,steps=40,warmup=10 \
    >"$LOG/bench_gpu1.log" 2>&1 &
  local p1=$!
  wait $p0 $p1
}

part_ddp() {
  $PY -m torch.distributed.run --nproc_per_node=2 bench/train_bench.py --jsonl "$LOG/bench_ddp.jsonl" --verbose \
    --device $DEV --model $MODEL --seq-len $SEQ $BENCH_EXTRA \
    --config impl=ours,micro=32,accum=4,compile=regional,steps=10,warmup=3 \
    --config impl=ours,micro=32,compile=regional,steps=40,warmup=10 \
    >"$LOG/bench_ddp.log" 2>&1
}

# One stop-at-push + wipe + cold-resume pair of trainer/train.py legs. $1 = tag, $2 = precision.
leg_pair() {
  local tag=$1 prec=$2 store="$PWD/runs/store_a" out="/tmp/a_out_$1"
  local tps=$((2 * MICRO_A * ACCUM_A * SEQ))
  local common=(--model "$MODEL" --device "$DEV" --root "$PWD/runs/mix_a" --out "$out"
                --hub-repo "file://$store/probe/a-$tag" --prune --seq-len "$SEQ" --attn sdpa --no-grad-ckpt
                --micro-batch "$MICRO_A" --accum "$ACCUM_A" --tokens $((6 * tps)) --lr 6e-4 --push-every-steps 3
                --val-tokens $tps --log-every 1 --resume auto --precision "$prec")
  rm -rf "$out"
  $PY -m torch.distributed.run --nproc_per_node=2 -m trainer.train "${common[@]}" --stop-after-steps 3 \
    >"$LOG/a_${tag}_leg1.log" 2>&1; echo "a $tag leg1 rc=$?" | tee -a "$SUM"
  rm -rf "$out"   # cold resume: nothing local survives, the store alone
  $PY -m torch.distributed.run --nproc_per_node=2 -m trainer.train "${common[@]}" --stop-after-steps 0 \
    >"$LOG/a_${tag}_leg2.log" 2>&1; echo "a $tag leg2 rc=$?" | tee -a "$SUM"
  for l in 1 2; do
    grep -hE '^(\[default0\]:)?(precision:|CKPT pushed|CKPT verify|CKPT wait|resume from|peak_stats|step [0-9]+/)' \
      "$LOG/a_${tag}_leg$l.log" | sed "s/^/  [$tag leg$l] /" | tee -a "$SUM"
    grep -h 'RUN_JSON' "$LOG/a_${tag}_leg$l.log" | sed 's/^.*RUN_JSON //' |
      $PY -c 'import json,sys
for line in sys.stdin:
    r = json.loads(line); r.pop("losses", None)
    print("  RUN", json.dumps({k: r.get(k) for k in ("final_step","resumed_from_step","tok_per_s","precision","world_size","peak_gpu_gb","peak_gpu_gb_max_rank","peak_reserved_gb_max_rank","final_loss","val_loss","push_steps","seconds","nonfinite_losses")}))' | tee -a "$SUM"
  done
}

part_a() {
  rm -rf "$PWD/runs/mix_a" "$PWD/runs/store_a"
  $PY -m trainer.mix build --out "$PWD/runs/mix_a" --synthetic --tokens 7000000 --val-tokens 600000 \
    --vocab "$VOCAB_A" >"$LOG/a_mix.log" 2>&1 || { say "a: mix build failed"; tail -5 "$LOG/a_mix.log"; return; }
  for prec in ${PRECS_A:-bf16 fp16}; do leg_pair "$prec" "$prec"; done
}

part_b() {
  local t=$(date +%s) ev rc
  SPECPROBE_TARGET=gpu $PY -m engine.cli run specs/p4_smoke.yaml >"$LOG/b_engine.log" 2>&1
  rc=$?
  say "b: engine run rc=$rc wall_s=$(( $(date +%s) - t ))"
  tail -45 "$LOG/b_engine.log" | tee -a "$SUM"
  ev=$(ls -td runs/p4_smoke-*/ 2>/dev/null | head -1)
  [ -n "$ev" ] && cp "$ev/evidence.json" "$OUT/evidence.json" && cp -r "$ev/logs" "$LOG/b_logs" 2>/dev/null
  # The gpu target uses the local store only, but specs/lib/p4_common.yaml passes --need-token to its
  # preflight for every non-local target. If that alone stopped the run, run it again with a placeholder
  # token (nothing on this machine can reach the Hub; the store is file://) so the legs and checks are
  # measured, and keep both evidence files: evidence_precondition.json is the first, untouched verdict.
  if [ $rc = 3 ] && [ -n "$ev" ] && grep -q "HF_TOKEN is not set" "$ev/logs/preflight.log" 2>/dev/null &&
     ! grep -q "GPU" "$ev/logs/preflight.log"; then
    mv "$OUT/evidence.json" "$OUT/evidence_precondition.json"
    say "b: PRECONDITION on HF_TOKEN for the local-store gpu target; rerun with HF_TOKEN=placeholder-gpu-target-local-store"
    t=$(date +%s)
    HF_TOKEN=placeholder-gpu-target-local-store SPECPROBE_TARGET=gpu $PY -m engine.cli run specs/p4_smoke.yaml \
      >"$LOG/b_engine2.log" 2>&1
    rc=$?
    say "b: engine run (placeholder token) rc=$rc wall_s=$(( $(date +%s) - t ))"
    tail -45 "$LOG/b_engine2.log" | tee -a "$SUM"
    ev=$(ls -td runs/p4_smoke-*/ 2>/dev/null | head -1)
    [ -n "$ev" ] && cp "$ev/evidence.json" "$OUT/evidence.json" && cp -r "$ev/logs" "$LOG/b_logs2" 2>/dev/null
  fi
}

# One 2-rank session of trainer/train.py at the reference shape, fresh store, to the horizon, a push every
# 2 steps. $1 = tag, $2 = steps, $3 = accum, the rest = extra trainer flags.
ref_leg() {
  local tag=$1 steps=$2 accum=$3; shift 3
  local tps=$((2 * MICRO_A * accum * SEQ)) out="/tmp/r_out_$1"
  [ -f "$PWD/runs/mix_r/manifest.json" ] || $PY -m trainer.mix build --out "$PWD/runs/mix_r" --synthetic \
    --tokens 3000000 --val-tokens 300000 --vocab "$VOCAB_A" >"$LOG/r_mix.log" 2>&1 || { say "mix build failed"; return; }
  rm -rf "$out" "$PWD/runs/store_r/probe/r-$tag"
  local t=$(date +%s)
  $PY -m torch.distributed.run --nproc_per_node=2 -m trainer.train --model "$MODEL" --device "$DEV" \
    --root "$PWD/runs/mix_r" --out "$out" --hub-repo "file://$PWD/runs/store_r/probe/r-$tag" --prune \
    --seq-len "$SEQ" --attn sdpa --no-grad-ckpt --micro-batch "$MICRO_A" --accum "$accum" \
    --tokens $((steps * tps)) --lr 6e-4 --push-every-steps 2 --val-tokens $tps --log-every 1 \
    --resume never --precision "$PREC_R" "$@" >"$LOG/r_$tag.log" 2>&1
  say "r $tag rc=$? wall_s=$(( $(date +%s) - t ))"
  grep -hE '^(\[default0\]:)?(precision:|compile( kernels)?:|cuda graphs:|CKPT (save|wait|snapshot)|peak_stats|step [0-9]+/|fused)' \
    "$LOG/r_$tag.log" | sed "s/^\[default0\]://; s/^/  [$tag] /" | tee -a "$SUM"
  grep -hE 'Error|Traceback|MISMATCH' "$LOG/r_$tag.log" | head -8 | sed "s/^/  [$tag] ! /" | tee -a "$SUM"
  grep -h 'RUN_JSON' "$LOG/r_$tag.log" | sed 's/^.*RUN_JSON //' | $PY -c 'import json,sys
for line in sys.stdin:
    r = json.loads(line)
    step_s = r["tokens_per_step"] / r["tok_per_s"] if r.get("tok_per_s") else None
    p = r.get("ckpt_pause_s_max")
    print("  RUN", json.dumps({k: r.get(k) for k in ("final_step","tok_per_s","ckpt_pause_s_max","ckpt_wait_s_max","precision","peak_gpu_gb_max_rank","peak_reserved_gb_max_rank","final_loss","val_loss","push_steps","seconds","nonfinite_losses")}))
    if step_s and p is not None:
        tok = r["tok_per_s"]
        print(f"  PAUSE max {p*1000:.1f} ms = {100*p/step_s:.2f} % of one step ({step_s:.3f} s at {tok:.0f} tok/s, step 1 excluded)")' | tee -a "$SUM"
}

# One GPU, one process per part, rows in order of what they decide (a timeout loses the last ones).
S=steps=30,warmup=8
bench0() {
  local tag=$1; shift
  local args=()
  for c in "$@"; do args+=(--config "$c"); done
  CUDA_VISIBLE_DEVICES=${GPU:-0} $PY bench/train_bench.py --jsonl "$LOG/bench_$tag.jsonl" --verbose \
    --device $DEV --model $MODEL --seq-len $SEQ $BENCH_EXTRA "${args[@]}" >>"$LOG/bench_$tag.log" 2>&1
}
# Run 4 ran these rows when the loss default was 1024-row chunks; since then the default (ce_rows=0) is
# 4096 rows at micro 32, so the rows below compare against ce_rows=1024 explicitly.
part_speed() {
  bench0 speed \
    micro=32,compile=regional,$S,prof=1 \
    micro=32,compile=regional,$S,gqa=1 \
    micro=32,compile=regional,$S,ce_rows=1024 \
    micro=32,compile=regional,$S,ce_rows=8192 \
    micro=32,compile=regional,$S,gqa=1,ce_rows=1024 \
    micro=32,compile=regional,$S,sdpa=cudnn \
    micro=32,compile=regional,$S,gqa=1 \
    micro=32,compile=regional,$S \
    task=check,micro=8,compile=regional,steps=50,noise=1 \
    micro=32,compile=regional,$S,cmode=reduce-overhead
}
# Run 5: one process per row (no dynamo.reset between configs in one process), the rows interleaved and
# repeated, HF+compile in the same order, so "ours vs HF" is a ratio of neighbours, not of one lucky row.
# new = the defaults after run 5's changes; old = the defaults of run 4 (fp32 residual, in-place loss pass
# compiled as it was, separate fp32 add of the loss's weight gradient); then one lever off at a time.
M32=micro=32,compile=regional,steps=40,warmup=10
OLD=res=0,cefuse=inplace,wacc=0,gqa=0
part_speed5() {
  local rep c
  for rep in 1 2; do
    bench0 speed5 impl=hf,micro=32,compile=full,steps=40,warmup=10
    bench0 speed5 $M32
    bench0 speed5 $M32,$OLD
    bench0 speed5 $M32,gqa=1
    if [ $rep = 1 ]; then
      for c in res=0 cefuse=inplace wacc=0; do bench0 speed5 $M32,$c; done
    fi
  done
  bench0 speed5 $M32,gqa=1,prof=1
}
# Micro 4 (the reference shape): memory and speed, new vs old defaults, and with enable_gqa.
part_m4() {
  bench0 m4 micro=4,compile=regional,steps=40,warmup=10 micro=4,compile=regional,steps=40,warmup=10,$OLD \
    micro=4,compile=regional,steps=40,warmup=10,gqa=1 micro=4,accum=32,compile=regional,steps=3,warmup=2,gqa=1
}
# The fast path (new defaults: bf16 residual among them) against plain bf16 and plain fp32, 50 steps.
part_check5() { bench0 check5 task=check,micro=8,compile=regional,steps=50,noise=1; }
# Run 6: levers on top of run 5's defaults (gqa now auto = on), HF+compile first in the same call.
part_speed6() {
  bench0 speed6 impl=hf,micro=32,compile=full,steps=40,warmup=10
  bench0 speed6 $M32
  bench0 speed6 $M32,sdpa=flash
  bench0 speed6 $M32,ce_rows=8192
  bench0 speed6 $M32,ce_rows=16384
  bench0 speed6 $M32,ctune=1
  bench0 speed6 micro=32,compile=full,steps=40,warmup=10
  bench0 speed6 $M32
}
part_m4b() {
  bench0 m4b micro=4,accum=32,compile=regional,steps=3,warmup=2 micro=4,compile=regional,steps=40,warmup=10
}
part_autotune6() { bench0 autotune6 $M32,cmode=max-autotune-no-cudagraphs; }
# Run 7 (nvidia-h200-x2): LEAN_ACTIVATIONS on (new default) vs off, on GPU 0 alone; HF+compile in the same
# call; the 1-rank and 2-rank rows of the same per-rank shape; then the trainer at the reference shape.
part_lean() {
  bench0 lean $M32
  bench0 lean $M32,lean=0
  bench0 lean impl=hf,micro=32,compile=full,steps=40,warmup=10
  bench0 lean micro=4,accum=32,compile=regional,steps=3,warmup=2 micro=4,accum=32,compile=regional,steps=3,warmup=2,lean=0
  bench0 lean micro=32,accum=4,compile=regional,steps=10,warmup=3
}
part_ddp7() {
  $PY -m torch.distributed.run --nproc_per_node=2 bench/train_bench.py --jsonl "$LOG/bench_ddp7.jsonl" --verbose \
    --device $DEV --model $MODEL --seq-len $SEQ $BENCH_EXTRA \
    --config impl=ours,micro=32,accum=4,compile=regional,steps=10,warmup=3 \
    --config impl=ours,micro=4,accum=32,compile=regional,steps=3,warmup=2 >>"$LOG/bench_ddp7.log" 2>&1
}
# Run 9 (nvidia-h200-x2): two lanes of one-process rows at once, one a GPU, each opened and closed by the
# HF+compile row and holding the defaults, so every lever is a ratio to neighbours on its own card.
HF32=impl=hf,micro=32,compile=full,steps=40,warmup=10
F32=micro=32,compile=full,steps=40,warmup=10
part_speed9() {
  ( export GPU=0
    # run 9 also ran cefuse=triton rows here: a one-read loss kernel, measured slower and removed since
    bench0 speed9a $HF32; bench0 speed9a $M32; bench0 speed9a $M32,fuse=1; bench0 speed9a $HF32 ) &
  ( export GPU=1
    bench0 speed9b $HF32; bench0 speed9b $M32; bench0 speed9b $F32,ctune=1; bench0 speed9b $F32,cmode=reduce-overhead
    bench0 speed9b $M32,ind=combo_kernels:True; bench0 speed9b $HF32 ) &
  wait
}
# Run 10 (nvidia-h200-x2): the whole-model compile with kernel tuning (F32C, the trainer's new cuda
# default) and what may add to it (CUDA graphs, combo kernels) on GPU 0; on GPU 1 fp16 vs bf16, and the
# drift and fast-vs-plain checks at the new default. Both lanes open and close with HF+compile.
F32C=$F32,ctune=1
F8C=micro=8,compile=full,ctune=1
part_speed10() {
  ( export GPU=0
    bench0 speed10a $HF32; bench0 speed10a $F32C; bench0 speed10a $F32C,cmode=reduce-overhead
    bench0 speed10a $F32C,ind=combo_kernels:True; bench0 speed10a $HF32 ) &
  ( export GPU=1
    bench0 speed10b $HF32; bench0 speed10b $M32; bench0 speed10b $M32,prec=fp16,warmup=20
    bench0 speed10b task=drift,$F8C,warmup=10,windows=20/180/1000
    bench0 speed10b task=check,$F8C,steps=50,noise=1; bench0 speed10b $HF32 ) &
  wait
}
# Run 11: a second sample of the fast-vs-plain check at the new default (run 10's one sample sat above
# its noise floor), after the 2-rank trainer run (part pause) with it.
part_check10() { bench0 check10 task=check,$F8C,steps=50,noise=1; }
# Runs 16 and 17: with the run-14 default that check did not finish in 270 s nor in 545 s (GPU idle at
# ~118 W throughout: the host compiling), where run 11's default finished it in 131 s. Which of the two
# changes since then does it (combo kernels, or the fp32 weight-gradient Function)? One lane each and a
# control with neither, on two GPUs (CHECK_GPU_B=0 puts all on one: a loss check, not a speed row); a row
# its budget kills now logs its progress and every thread's stack (bench/train_bench.py registers faulthandler on SIGTERM).
part_checkbisect() {
  ( export GPU=0; bench0 checkbisect task=check,$F8C,steps=50,noise=1 ) &
  ( export GPU=${CHECK_GPU_B:-1}; bench0 checkbisectb task=check,$F8C,steps=50,noise=1,combo=0 ) &
  ( export GPU=${CHECK_GPU_B:-1}; bench0 checkbisectc task=check,$F8C,steps=50,noise=1,pbwd=autograd ) &
  # the control: run 11's default (neither change), which finished this check in 131 s
  ( export GPU=0; bench0 checkbisectd task=check,$F8C,steps=50,noise=1,combo=0,pbwd=autograd ) &
  wait
}
# Run 12: the row run 10 lost (combo kernels on the whole model, where they could merge the ~300 weight
# casts of a step) and CUDA graphs on top of the default, each lane its own HF rows. Since run 14 the bench's
# defaults follow the trainer's (pbwd=fp32; combo=1 in runs 14-18, combo=0 since run 19), so $F32C was run
# 14's default in runs 14-18 (add combo=1 to repeat those rows now); run 12's was $OLDD.
part_speed12() {
  ( export GPU=0
    bench0 speed12a $HF32; bench0 speed12a $F32C,prof=1; bench0 speed12a $F32C,ind=combo_kernels:True; bench0 speed12a $HF32 ) &
  ( export GPU=1
    bench0 speed12b $HF32; bench0 speed12b $F32C,cmode=reduce-overhead
    bench0 speed12b $F32C,cmode=reduce-overhead,ind=combo_kernels:True; bench0 speed12b $HF32 ) &
  wait
}
# Run 13: the projections' backward (pbwd) on the whole model with combo kernels, each next to its own
# baseline on its card; then the fast-vs-plain check of the combination (an Inductor cache carried from
# run 12 makes the repeated configs' compiles seconds).
CK=ind=combo_kernels:True
# Run 13 also ran pbwd=grouped rows here (after the pbwd=fp32 row in lane a; with CUDA graphs and in the
# check in lane b): one input-gradient GEMM for q/k/v and gate/up, measured -5 % and removed since.
part_speed13() {
  ( export GPU=0
    bench0 speed13a $HF32; bench0 speed13a $F32C,$CK,pbwd=autograd; bench0 speed13a $F32C,$CK,pbwd=fp32
    bench0 speed13a $HF32 ) &
  ( export GPU=1
    bench0 speed13b $HF32; bench0 speed13b $F32C,$CK,cmode=reduce-overhead,pbwd=autograd; bench0 speed13b $HF32 ) &
  wait
}
# Run 14: the new cuda default (whole model + tuning + combo kernels + fp32 weight gradients) beside run 12's
# default on one card, with CUDA graphs and at the trainer's micro 4 x accum 32 on the other, and its
# fast-vs-plain check.
OLDD=$F32C,combo=0,pbwd=autograd
part_speed14() {
  ( export GPU=0
    bench0 speed14a $HF32; bench0 speed14a $OLDD; bench0 speed14a $F32C
    bench0 speed14a task=check,micro=8,compile=full,ctune=1,steps=50,noise=1; bench0 speed14a $HF32 ) &
  ( export GPU=1
    bench0 speed14b $HF32; bench0 speed14b $F32C,cmode=reduce-overhead
    bench0 speed14b micro=4,accum=32,compile=full,ctune=1,steps=3,warmup=2; bench0 speed14b $HF32 ) &
  wait
}
# Run 15 (nvidia-h200-x2): what could cut the ~4 ms a step spent between 1,760 kernels (run 12), each lane
# opened and closed by HF+compile. GPU 0: Programmatic Dependent Launch (Hopper: a Triton kernel starts while
# its predecessor drains; Inductor's triton.enable_pdl), profiled, beside the default. GPU 1: PDL with CUDA
# graphs, and Inductor's fusion knobs (aggressive fusion, wider combo kernels).
PDL=ind=triton.enable_pdl:True
part_speed15() {
  ( export GPU=0
    bench0 speed15a $HF32; bench0 speed15a $F32C,$PDL,prof=1; bench0 speed15a $F32C; bench0 speed15a $HF32 ) &
  ( export GPU=1
    bench0 speed15b $HF32; bench0 speed15b $F32C,cmode=reduce-overhead,$PDL
    bench0 speed15b $F32C,ind=aggressive_fusion:True+combo_kernel_max_num_nodes:16+combo_kernel_allow_mixed_sizes:2
    bench0 speed15b $HF32 ) &
  wait
}
# Run 19 (nvidia-h200-x2), after run 18 found the stall: with combo kernels, coordinate-descent tuning
# compiles every candidate config of each combo kernel with ptxas, one after another, in the first backward
# (minutes at micro 8); without them the check's compile took 65-67 s. So the candidates are measured
# without combo kernels. GPU 0: run 11's default (D), D + fp32 weight gradients (B), B + the grouped
# input-gradient GEMMs with the ConcatKernel lowering and the cat-free RoPE (G, profiled). GPU 1: the
# 50-step checks of B (a second sample: run 18's sat above the floor on the mean) and of G, then the speed
# rows again (a second sample on another card).
NC=$F32C,combo=0
# Inductor's ConcatKernel lowering of a cat (each producer writes its slice; the second knob is newer than 2.11)
CATK=ind=max_pointwise_cat_inputs:0+max_complex_pointwise_cat_inputs?:0
G19=$NC,pbwd=grouped,rope=roll,$CATK
part_speed19() {
  ( export GPU=0
    bench0 speed19a $HF32; bench0 speed19a $NC,pbwd=autograd; bench0 speed19a $NC; bench0 speed19a $G19,prof=1
    bench0 speed19a $HF32 ) &
  ( export GPU=1
    bench0 speed19b task=check,$F8C,combo=0,steps=50,noise=1
    bench0 speed19b task=check,$F8C,combo=0,pbwd=grouped,rope=roll,$CATK,steps=50,noise=1
    bench0 speed19b $HF32; bench0 speed19b $NC,pbwd=autograd; bench0 speed19b $NC; bench0 speed19b $G19
    bench0 speed19b $HF32 ) &
  wait
}
# Run 22 (combo8) placed the stall: at micro 8 combo kernels with coordinate-descent tuning were still tuning
# after 466 s, and without the tuning they compiled in 73 s (micro 16 with both: 194 s). So combo kernels
# instead of the tuning, against the default (the tuning without them): micro 32 on GPU 0 between HF rows,
# micro 4 on GPU 1 (launch-bound, where combo kernels were worth +22 % in the trainer, runs 16 and 20),
# the two together last there.
part_combo22() {
  local m4=micro=4,compile=full,steps=40,warmup=10
  ( export GPU=0; bench0 combo22a $HF32; bench0 combo22a $NC; bench0 combo22a $F32,combo=1,ctune=0
    bench0 combo22a $HF32 ) &
  ( export GPU=1; bench0 combo22b $m4,ctune=1; bench0 combo22b $m4,combo=1,ctune=0
    bench0 combo22b $m4,combo=1,ctune=1 ) &
  wait
}
# Run 25: combo kernels instead of the tuning equal the default at micro 32, are +19 % at micro 4 and compile
# in 60-73 s at every shape tried. Before they become the cuda default: GPU 0 their 50-step fast-vs-plain check
# at micro 8 (with the noise floor); GPU 1 micro 4 with CUDA graphs on top (the host's launches set the pace
# there) and HF+compile at micro 4 for scale; then the 2-rank trainer at the reference shape with them
# (memory, pause, first-step compile), selected by the trainer's own environment switches.
part_check26() {
  local m4=micro=4,compile=full,ctune=0,combo=1,steps=40,warmup=10
  ( export GPU=0; bench0 check26a task=check,micro=8,compile=full,ctune=0,combo=1,steps=50,noise=1 ) &
  ( export GPU=1; bench0 check26b $m4,cmode=reduce-overhead; bench0 check26b impl=hf,micro=4,compile=full,steps=40,warmup=10 ) &
  wait
  SPECPROBE_COMBO_KERNELS=1 TORCHINDUCTOR_COORDINATE_DESCENT_TUNING=0 ref_leg combo "$STEPS_R" "$ACCUM_A"
}
# Run 26 measured CUDA graphs at micro 4 at 3.4x the same compile without them (launch-bound shape): do
# they keep the gradients under accumulation (the trainer's micro 4 x accum 32), what do they give at micro
# 32, and does the 2-rank trainer run with them (DDP splits the graph at its buckets)?
part_graphs27() {
  local g=task=graphs,micro=4,accum=4,compile=full,ctune=1,steps=30,gsteps=3
  ( export GPU=0; bench0 graphs27a $g; bench0 graphs27a $g,zero=none ) &
  ( export GPU=1; bench0 graphs27b impl=hf,micro=32,compile=full,steps=30,warmup=8 \
      micro=32,compile=full,ctune=1,cmode=reduce-overhead,steps=40,warmup=10 ) &
  wait
  ref_leg graphs "$STEPS_R" "$ACCUM_A"
}
# Run 27's two follow-ups: the gradient check with its floor (the compiled path vs the uncompiled one), and
# the checkpoint pause of the 2-rank trainer with CUDA graphs after moving the copies' enqueue and the RNG
# gather off NCCL (run 27: 14-19 ms = 4 % of the 4x shorter step); GPU 1 meanwhile: micro 4 with the
# default and CUDA graphs beside HF.
part_graphs28() {
  ( export GPU=0; bench0 graphs28a task=graphs,micro=4,accum=4,compile=full,ctune=1,steps=30,gsteps=3 ) &
  ( export GPU=1; bench0 graphs28b impl=hf,micro=4,compile=full,steps=40,warmup=10 \
      micro=4,compile=full,ctune=1,cmode=reduce-overhead,steps=40,warmup=10 ) &
  wait
  ref_leg graphs "$STEPS_R" "$ACCUM_A"
}
# 2 ranks (NCCL) against 1 rank at micro 32 x accum 4 with the cuda default (whole model + tuning + fp32
# weight gradients; combo kernels too before run 19); runs 2 and 7 measured the scaling with regional compile only. Under DDP
# dynamo splits the whole-model graph at the gradient buckets, so the 2-rank row compiles graphs of its own.
# Is the combo-kernel stall (runs 13-18: every try at micro 8, all in the 50-step check) micro 8's alone,
# and which tuning makes it? Four rows at once, two a GPU, each with faulthandler's stacks if the budget
# ends it (at micro 4 and 32 their compile ended in 83-169 s, runs 14-16): a speed row at micro 8 (a) and
# at micro 16 (b) with combo kernels and coordinate-descent tuning; at micro 8 the same without the combo
# kernels' own multi-config autotuning (c), and combo kernels without coordinate-descent tuning (d). The
# question is whether and when each compile ends; two rows share a GPU, so their tok/s are not comparable.
part_combo8() {
  local c8=micro=8,compile=full,combo=1,steps=20,warmup=3
  ( export GPU=0; bench0 combo8a $c8,ctune=1 ) &
  ( export GPU=1; bench0 combo8b micro=16,compile=full,combo=1,steps=20,warmup=3,ctune=1 ) &
  ( export GPU=0; bench0 combo8c $c8,ctune=1,ind=combo_kernels_autotune?:0 ) &
  ( export GPU=1; bench0 combo8d $c8,ctune=0 ) &
  wait
}
# DDPFULL_CFG replaces the row; DDPFULL_CFG2 adds a second 2-rank row (run 21: pbwd=autograd, whose 1-rank compile a carried cache already holds).
part_ddpfull() {
  local cfg=${DDPFULL_CFG:-micro=32,accum=4,compile=full,ctune=1,steps=10,warmup=3}
  GPU=0 bench0 ddpfull "$cfg"
  $PY -m torch.distributed.run --nproc_per_node=2 bench/train_bench.py --jsonl "$LOG/bench_ddpfull.jsonl" \
    --verbose --device $DEV --model $MODEL --seq-len $SEQ $BENCH_EXTRA --config "$cfg" \
    ${DDPFULL_CFG2:+--config "$DDPFULL_CFG2"} >>"$LOG/bench_ddpfull.log" 2>&1
}
part_ddp35() {
  local c=micro=4,accum=32,compile=full,ctune=1,cmode=reduce-overhead,steps=20,warmup=3
  GPU=0 bench0 ddp35 "$c"
  $PY -m torch.distributed.run --nproc_per_node=2 bench/train_bench.py --jsonl "$LOG/bench_ddp35.jsonl" \
    --verbose --device $DEV --model $MODEL --seq-len $SEQ $BENCH_EXTRA --config "$c" --config "$c,gcfreeze=0" \
    --config "$c,ddpopt=0" --config "$c,prof=1" >>"$LOG/bench_ddp35.log" 2>&1
}
# Inductor's generated code for the regional block graphs (forward and backward) at micro 32, for reading.
part_ocode() { TORCH_LOGS=output_code bench0 ocode micro=32,compile=regional,steps=1,warmup=1; }
part_pauselean0() { SPECPROBE_LEAN_ACTIVATIONS=0 ref_leg pauselean0 "$STEPS_R" "$ACCUM_A"; }
part_full() { bench0 full micro=32,compile=full,steps=20,warmup=3; }
part_autotune() { bench0 autotune micro=32,compile=regional,steps=20,warmup=3,cmode=max-autotune-no-cudagraphs; }
part_ckpt() {
  $PY bench/ckpt_bench.py --layers $CKPT_LAYERS --repeat 1 --dir /tmp/ckpt_bench --jsonl "$LOG/ckpt.jsonl" \
    >"$LOG/ckpt.log" 2>&1
  say "ckpt rc=$?"
  grep -hE '^CKPT_|^ *[-0-9]+ ' "$LOG/ckpt.log" | tee -a "$SUM"
  grep -hE 'Error|Traceback' "$LOG/ckpt.log" | head -5 | tee -a "$SUM"
}

part_pause() { ref_leg pause "$STEPS_R" "$ACCUM_A"; }
part_check() { SPECPROBE_SNAPSHOT=async SPECPROBE_SNAPSHOT_CHECK=1 ref_leg check 6 "$ACCUM_CHECK" --no-compile; }
part_nocomp() { ref_leg nocomp "$STEPS_R" "$ACCUM_A" --no-compile; }

for part in $PARTS; do
  budget_var="T_${part^^}"; budget=${!budget_var:-200}
  ts=$(date +%s)
  say "=== part $part (budget ${budget}s) at +$((ts - T0))s"
  export -f part_$part leg_pair ref_leg say bench0 2>/dev/null
  export LOG SUM PY T0 S M32 OLD HF32 F32 F32C F8C CK OLDD PDL CATK NC G19 CKPT_LAYERS PRECS_A DEV MODEL SEQ BENCH_EXTRA MICRO_A ACCUM_A VOCAB_A PREC_R STEPS_R ACCUM_CHECK
  timeout --signal=TERM --kill-after=10 "$budget" bash -c "part_$part"
  rc=$?
  [ $rc = 124 ] && say "part $part TIMED OUT after ${budget}s"
  say "=== part $part rc=$rc took $(( $(date +%s) - ts ))s"
  cat "$LOG"/bench_*.jsonl >"$OUT/bench.jsonl" 2>/dev/null
  [ "$part" = bench ] && $PY bench/train_bench.py --table "$LOG"/bench_gpu0.jsonl "$LOG"/bench_gpu1.jsonl 2>&1 | tee -a "$SUM"
  [ "$part" = ddp ] && $PY bench/train_bench.py --table "$LOG"/bench_ddp.jsonl 2>&1 | tee -a "$SUM"
  # The part's own bench rows, found by name (bench_<part>, or one lane each: bench_<part>[abcd]) rather
  # than by a list of parts: bench and ddp print their tables above, parts without bench rows find none.
  { [ "$part" = bench ] || [ "$part" = ddp ]; } && continue
  logs=()
  for f in "$LOG/bench_$part".log "$LOG/bench_$part"[abcd].log; do [ -f "$f" ] && logs+=("$f"); done
  [ ${#logs[@]} = 0 ] && continue
  for f in "${logs[@]}"; do
    [ -f "${f%.log}.jsonl" ] && $PY bench/train_bench.py --table "${f%.log}.jsonl" 2>&1 | tee -a "$SUM"
  done
  grep -hE 'Error|Traceback|error:' "${logs[@]}" | sort | uniq -c | head -8 | tee -a "$SUM"
  grep -H '^check: path' "${logs[@]}" | sed "s|^$LOG/||" | tee -a "$SUM"
  # a row its budget killed: where its main thread was (faulthandler's dump on SIGTERM)
  grep -H -A14 '^Current thread' "${logs[@]}" | sed "s|^$LOG/||" | head -60 | tee -a "$SUM"
  # and any other thread caught inside Inductor or Triton (run 18: the autograd engine's device thread was
  # the one tuning kernels, which the main thread's stack does not show), idle frames left out
  for f in "${logs[@]}"; do
    awk -v f="${f#$LOG/}" '/^(Thread|Current thread) 0x/ {if (busy) exit; blk=""; main=/^Current/}
      /^(Thread|Current thread) 0x/ || /^  File / {if ($0 !~ /threading.py/) blk=blk f ": " $0 "\n"}
      /^  File .*(_inductor|triton)/ && !/subproc_pool/ && !main {busy=1}
      END {if (busy) printf "%s", blk}' "$f" | head -30 | tee -a "$SUM"
  done
done
tar -czf "$OUT/logs.tgz" -C "$LOG" . 2>/dev/null
# Inductor's on-disk cache (compiled graphs, Triton kernels, their tuned configs), for a later call to carry
# back as .ind_cache/ (see the top) so its rows skip minutes of compile and tuning. 16 MiB a file come back.
if [ -n "${INDUCTOR_CACHE_OUT:-}" ] && [ -d "$IND_DIR" ]; then
  tar -czf /tmp/ind_cache.tgz -C "$IND_DIR" .
  n=$(( ($(stat -c %s /tmp/ind_cache.tgz) + 15728639) / 15728640 )); what=all
  if [ "$n" -gt 4 ]; then   # too big with what was carried in: only what this call compiled
    (cd "$IND_DIR" && find . -type f -newer "$LOG/.t0" -print0 | tar -czf /tmp/ind_cache.tgz --null -T -)
    n=$(( ($(stat -c %s /tmp/ind_cache.tgz) + 15728639) / 15728640 )); what="this call's"
  fi
  if [ "$n" -le 4 ]; then split -b 15M -a 1 /tmp/ind_cache.tgz "$OUT/ind_cache.tgz."; fi
  say "inductor cache: $(du -sh "$IND_DIR" | cut -f1), $what entries in $n part(s) of 15 MiB compressed$([ "$n" -le 4 ] || echo ': too big, left behind')"
fi
say "device_all.sh done in $(( $(date +%s) - T0 ))s"
