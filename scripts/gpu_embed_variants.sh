#!/usr/bin/env bash
# On a warm lent GPU after scripts/gpu_session.sh (its /tmp/site and /tmp/gcwork): elmo embed's variants, one run each,
# each run's summary line and JSON into $OUT/embed_variants.txt; about 5 minutes warm.
set -u
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
W=/tmp/gcwork; R=$OUT/embed_variants.txt
[ -d /tmp/site ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
[ -d $W/corpus ] || timeout 120 python3 bench/gpu_check.py --work $W --only kernels --out $OUT/kernels  # writes the model and corpus
run() {  # name, then flags
  local name=$1; shift; rm -rf $W/v
  local t0=$(date +%s.%N)
  timeout 150 python3 -m elmo_cli embed --text ${W_CORPUS:-$W/corpus} --out $W/v --model $W/model --device cuda --json "$@" > $W/v.json 2> $W/v.err
  local rc=$?; local t1=$(date +%s.%N)
  echo "== $name ($*): rc $rc, wall $(python3 -c "print(round($t1-$t0,1))") s" | tee -a $R
  python3 -c "
import json,sys; d=json.load(open('$W/v.json')); print(json.dumps({'this_run': d['this_run'], 'stages': d['stages'], 'batch': d['run']['batch'], 'shards': len(d['shards']), 'graphs': d['engine'].get('cuda_graphs')}))" 2>&1 | tee -a $R
  tail -3 $W/v.err >> $R
}
run defaults
run writers8 --writer-threads 8  # the default before it took the CPUs less four (12 of 16)
run budget16k --max-batch-tokens 16384
run budget32k --max-batch-tokens 32768
run arrow_f16 --format arrow --dtype float16
run f16_lists --dtype float16
# a corpus of several sort windows (~5M tokens): the first window's planning, the model's warm-up and
# the last window's writes weigh less than in gpu_check's 1.26M tokens
L=$W/corpus-large
[ -d $L ] || python3 -c "from corpora.sample import write_sample_corpus; write_sample_corpus('$L', rows=200_000, files=8)"
W_CORPUS=$L run large_defaults
W_CORPUS=$L run large_arrow_f16 --format arrow --dtype float16
W_CORPUS=$L run large_writers8 --writer-threads 8
# where the defaults' threads spend a job (the model thread's waits included): py-spy's raw stacks
if [ -x /tmp/site/bin/py-spy ]; then
  rm -rf $W/v
  timeout 150 /tmp/site/bin/py-spy record -r 100 --threads --idle -f raw -o $OUT/embed_defaults.pyspy.txt -- \
    python3 -m elmo_cli embed --text $W/corpus --out $W/v --model $W/model --device cuda --quiet >> $R 2>&1
  echo "== py-spy of the defaults: rc $?" | tee -a $R
fi
echo done | tee -a $R
