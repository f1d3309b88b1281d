"""Prometheus metric names that the server exports and the operator, gateway, dashboards and alerts read."""

REQUESTS_WAITING = "flotilla_requests_waiting"
REQUESTS_RUNNING = "flotilla_requests_running"
SLOTS = "flotilla_slots"
KV_BLOCKS_TOTAL = "flotilla_kv_blocks_total"
KV_BLOCKS_USED = "flotilla_kv_blocks_used"
KV_CACHE_USAGE_RATIO = "flotilla_kv_cache_usage_ratio"
PREEMPTIONS = "flotilla_preemptions"
KV_BLOCKS_CACHED = "flotilla_kv_blocks_cached"  # free blocks still holding a reusable prefix
# prefix-cache lookups, in tokens (counters: the exposition adds `_total`)
PREFIX_CACHE_QUERIES = "flotilla_prefix_cache_queries"
PREFIX_CACHE_HITS = "flotilla_prefix_cache_hits"
STEP_THREADS = "flotilla_step_threads"  # histogram: CPU threads each engine step ran on
# speculative decoding (--speculative ngram): drafts verified, their tokens, and those accepted (counters, _total);
# the acceptance rate since start (gauge, accepted / proposed)
SPEC_DRAFTS = "flotilla_spec_decode_drafts"
SPEC_PROPOSED_TOKENS = "flotilla_spec_decode_proposed_tokens"
SPEC_ACCEPTED_TOKENS = "flotilla_spec_decode_accepted_tokens"
SPEC_ACCEPTANCE_RATE = "flotilla_spec_decode_acceptance_rate"
# gauge: bytes of weights a model holds, packed copies included, labelled `quantization` (none, gguf:Q4_1+Q8_0)
MODEL_WEIGHT_BYTES = "flotilla_model_weight_bytes"
QUANTIZATION_LABEL = "quantization"

# The Gateway API Inference Extension's model-server protocol, exported beside ours.
VLLM_REQUESTS_WAITING = "vllm:num_requests_waiting"
VLLM_REQUESTS_RUNNING = "vllm:num_requests_running"
VLLM_KV_CACHE_USAGE = "vllm:kv_cache_usage_perc"
VLLM_PREFIX_CACHE_QUERIES = "vllm:prefix_cache_queries"  # on the wire: vllm:prefix_cache_queries_total
VLLM_PREFIX_CACHE_HITS = "vllm:prefix_cache_hits"

# Multi-model servers (docs/serving.md, "Multi-model mode"); every series carries `model` where one applies.
MODEL_LOAD_SECONDS = "flotilla_model_load_seconds"  # histogram: one observation per finished load
MODEL_EVICTIONS = "flotilla_model_evictions"  # counter (exposed as _total), labelled with the evicted model
MODEL_ENGINE_DEATHS = "flotilla_model_engine_deaths"  # counter (_total), by model: its engine stopped by itself
MODELS_RESIDENT = "flotilla_models_resident"  # gauge: models loaded now
MODEL_LRU_AGE_SECONDS = "flotilla_model_lru_age_seconds"  # gauge: seconds since the least recently used resident model served
MODEL_REQUESTS = "flotilla_model_requests"  # counter (exposed as _total): requests that named each model
MODEL_STATE = "flotilla_model_state"  # gauge: 1 for each model's current state (label `state`)
# the model list file: versions refused (a bad line, an unreadable file; counter, _total), entries not served
MODEL_LIST_RELOAD_FAILURES = "flotilla_model_list_reload_failures"
MODEL_LIST_SKIPPED = "flotilla_model_list_skipped"  # gauge: entries whose source cannot be read
# histogram: each load's phases (label `phase`: start, read, build, warmup; they sum to MODEL_LOAD_SECONDS) by
# where its weights came from (label `origin`: disk, or parked: evicted and kept outside the budget)
MODEL_LOAD_PHASE_SECONDS = "flotilla_model_load_phase_seconds"
MODELS_PARKED = "flotilla_models_parked"  # gauge: models parked now
MODEL_PARKED_BYTES = "flotilla_model_parked_bytes"  # gauge, by model: its parked weights and parked process's memory

GATEWAY_REQUESTS_HELD = "flotilla_gateway_requests_held"  # the autoscaler's pending demand P

# Latency histograms the SLO scaler reads (docs/autoscaling.md, "SLO scaling"). Their buckets are part of the
# contract: the operator's targets must fall inside them, and flotilla-sim emulates histogram_quantile on them.
TIME_TO_FIRST_TOKEN_SECONDS = "flotilla_time_to_first_token_seconds"  # arrival to first token, per request
INTER_TOKEN_LATENCY_SECONDS = "flotilla_inter_token_latency_seconds"  # gap between successive tokens, per token
LATENCY_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
ITL_BUCKETS_S = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56)

MODEL_LABEL = "model"  # every server and gateway series carries the served model name
MODEL_NAMESPACE_LABEL = "model_namespace"  # gateway series: the InferenceModel's namespace

REJECTION_REASONS = ("queue_full", "queue_timeout", "infeasible", "draining", "client_gone", "slow_client",
                     "tenant_limit")
