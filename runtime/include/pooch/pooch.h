/* pooch — train and run neural networks larger than the GPU they run on.
 *
 * The only public header. Conventions (as dav1d and ggml):
 *  - opaque handles; functions are pooch_<object>_<verb>;
 *  - every call returns pooch_status: 0 on success or a negative code;
 *    pooch_status_str() names it and pooch_last_error() gives the message of
 *    the last failure on the calling thread;
 *  - parameter structs are filled with defaults by pooch_*_default_params();
 *  - ABI: public structs only grow. A struct the caller allocates (the
 *    parameter structs, pooch_memory_report, pooch_metrics) ends in
 *    `reserved` bytes that later versions turn into new fields, where 0
 *    keeps the earlier behaviour; existing fields never move or change.
 *    So fill parameter structs with pooch_*_default_params() (which zeroes
 *    `reserved`), or zero them whole, before setting fields, and never touch
 *    `reserved` yourself. Structs the library hands out (pooch_epoch_report)
 *    may grow at their end;
 *  - pooch_*_free(&h) releases a handle and sets it to NULL, so freeing
 *    it again is harmless; every call given a NULL handle, or a NULL for
 *    a pointer it must read or write, returns POOCH_ERR_INVALID_ARG (calls
 *    without a status return 0 or ""). A handle used after it was freed
 *    through another copy of the pointer cannot be detected (as with free());
 *  - the library never aborts or exits the host program.
 * Threading: one session per thread at a time; pooch_session_cancel may be
 * called from any thread.
 */
#ifndef POOCH_H
#define POOCH_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(_WIN32)
#define POOCH_API __declspec(dllexport)
#elif defined(__GNUC__)
#define POOCH_API __attribute__((visibility("default")))
#else
#define POOCH_API
#endif

/* POOCH_VERSION_MAJOR, _MINOR, _PATCH and _STRING, generated from meson.build. */
#include "pooch/pooch_version.h"

typedef enum pooch_status {
  POOCH_OK = 0,
  POOCH_ERR_INVALID_ARG = -1,   /* a parameter or flag is wrong */
  POOCH_ERR_BAD_INPUT = -2,     /* a file or data set is malformed */
  POOCH_ERR_OUT_OF_BUDGET = -3, /* the plan does not fit the device budget */
  POOCH_ERR_NO_DEVICE = -4,     /* the requested device is not present */
  POOCH_ERR_UNSUPPORTED = -5,   /* no kernel or feature for this case */
  POOCH_ERR_CANCELLED = -6,     /* a callback or pooch_session_cancel stopped the call */
  POOCH_ERR_IO = -7,            /* reading or writing a file failed */
  POOCH_ERR_OUT_OF_MEMORY = -8, /* host memory could not be allocated */
  POOCH_ERR_INTERNAL = -9       /* a bug in pooch: please report it */
} pooch_status;

POOCH_API const char* pooch_status_str(pooch_status status);
/* The message of the last failed call on this thread ("" if none). */
POOCH_API const char* pooch_last_error(void);
/* After a call on this thread failed with POOCH_ERR_OUT_OF_BUDGET: the
 * smallest device budget, in bytes, that the planner found would fit (the
 * message names it rounded up to MiB), to set as pooch_session_params'
 * device_memory or to show a user. 0 when that failure named none, and after
 * any other failure or a call that succeeded. */
POOCH_API size_t pooch_last_error_budget(void);

/* Library version as (major << 16) | (minor << 8) | patch, and as a string. */
POOCH_API unsigned pooch_version(void);
POOCH_API const char* pooch_version_str(void);

typedef enum pooch_log_level {
  POOCH_LOG_DEBUG = 0,
  POOCH_LOG_INFO = 1,
  POOCH_LOG_WARN = 2,
  POOCH_LOG_ERROR = 3
} pooch_log_level;

typedef void (*pooch_log_fn)(void* user, pooch_log_level level, const char* message);
/* Messages at `min_level` and above go to `fn` (NULL: stderr, the default). */
POOCH_API void pooch_set_log(pooch_log_fn fn, void* user, pooch_log_level min_level);

/* ---------------------------------------------------------------------- */
/* Models                                                                 */

typedef struct pooch_model pooch_model;

typedef enum pooch_loss {
  POOCH_LOSS_BCE = 0,
  POOCH_LOSS_SQUARED_HINGE = 1,
  POOCH_LOSS_SOFTMAX = 2
} pooch_loss;

/* The extreme multi-label shape: sparse (bag-of-words) input -> linear(hidden)
 * -> relu [-> dropout] -> output layer over `labels`, dense or fixed fan-in. */
typedef struct pooch_xmc_params {
  int64_t features;   /* input width (bag-of-words vocabulary) */
  int64_t labels;     /* output width */
  int64_t hidden;     /* first layer width (default 256) */
  int64_t fan_in;     /* inputs per label in the fixed fan-in head; 0: dense head (default 32) */
  int64_t batch_size; /* rows per step (default 64) */
  int64_t max_nnz;    /* nonzeros per batch the graph reserves; 0: batch_size * 64 */
  float dropout;      /* after the hidden layer (default 0) */
  pooch_loss loss;    /* default BCE */
  uint64_t seed;      /* weight init, dropout, fan-in wiring (default 1) */
  int topk;           /* the most labels pooch_session_predict returns per row (default 5) */
  uint8_t reserved[64]; /* zero: room for new fields (see the top of this file) */
} pooch_xmc_params;

POOCH_API void pooch_xmc_default_params(pooch_xmc_params* p);
POOCH_API pooch_status pooch_model_create_xmc(const pooch_xmc_params* p, pooch_model** out);
/* A model from a JSON spec (docs/CLI.md, "Model specs"). `source` names it in
 * errors (a file name; may be NULL). */
POOCH_API pooch_status pooch_model_create_from_spec(const char* json, const char* source,
                                                    pooch_model** out);
/* A model or checkpoint file (.pooch). A session created from it starts from
 * its weights; from a checkpoint (with resume set in the session params) also
 * from its optimizer state, step and trainer position. */
POOCH_API pooch_status pooch_model_load(const char* path, pooch_model** out);
/* Finetuning on a new label set: replaces the output layer by a fresh one
 * over `labels`; every other weight is kept. */
POOCH_API pooch_status pooch_model_replace_head(pooch_model* model, int64_t labels);
/* How the model runs: rows per step, nonzeros reserved per batch (0: 64 per
 * row), the most labels predict returns. 0 keeps the current value. A new
 * batch size re-derives max_labels from it (set it again afterwards), and
 * max_nnz too unless one is given. */
POOCH_API pooch_status pooch_model_set_run_shape(pooch_model* model, int64_t batch_size,
                                                 int64_t max_nnz, int topk);
/* The positive labels a training batch may hold in all (0: 32 per row of
 * the batch size); a step whose batch holds more fails with
 * POOCH_ERR_INVALID_ARG. pooch_dataset_max_batch_labels gives what a data
 * set needs. */
POOCH_API pooch_status pooch_model_set_max_labels(pooch_model* model, int64_t max_labels);
/* The model's spec as JSON; valid until the model is freed or changed. */
POOCH_API const char* pooch_model_spec_json(const pooch_model* model);
/* 1 when the model was loaded from a checkpoint. */
POOCH_API int pooch_model_is_checkpoint(const pooch_model* model);
POOCH_API void pooch_model_free(pooch_model** model);

/* Tensors a caller sets or reads by name, for any model family. */
typedef enum pooch_dtype {
  POOCH_DTYPE_F32 = 0,
  POOCH_DTYPE_F64 = 1,
  POOCH_DTYPE_I32 = 2,
  POOCH_DTYPE_U16 = 3,
  POOCH_DTYPE_OTHER = 15 /* a type this header does not name yet */
} pooch_dtype;

#define POOCH_MAX_DIMS 8

typedef struct pooch_tensor_info {
  const char* name;  /* valid while the model lives */
  pooch_dtype dtype;
  int rank;
  int64_t shape[POOCH_MAX_DIMS]; /* -1 for the batch dimension (up to the planned rows) */
  int64_t max_rows;              /* the planned rows of the batch dimension; 0 without one */
  size_t bytes;                  /* at the planned size */
  uint8_t reserved[32];
} pooch_tensor_info;

POOCH_API int pooch_model_input_count(const pooch_model* model);
POOCH_API pooch_status pooch_model_input_info(const pooch_model* model, int i,
                                              pooch_tensor_info* out);
POOCH_API int pooch_model_output_count(const pooch_model* model);
POOCH_API pooch_status pooch_model_output_info(const pooch_model* model, int i,
                                               pooch_tensor_info* out);
/* The model's family ("xmc", "mlp", ...; "" when unknown). */
POOCH_API const char* pooch_model_family(const pooch_model* model);

/* Everything in a .pooch file as one JSON document (metadata, graph, tensor
 * table); free it with pooch_string_free. */
POOCH_API pooch_status pooch_file_describe(const char* path, char** json_out);
POOCH_API void pooch_string_free(char** s);

/* ---------------------------------------------------------------------- */
/* Training sessions                                                      */

typedef struct pooch_session pooch_session;

typedef enum pooch_optimizer {
  POOCH_OPT_ADAM = 0,
  POOCH_OPT_ADAMW = 1,
  POOCH_OPT_SGD = 2
} pooch_optimizer;

typedef enum pooch_device {
  POOCH_DEVICE_AUTO = 0, /* CUDA when a GPU is present, else the CPU (with one log line) */
  POOCH_DEVICE_CPU = 1,
  POOCH_DEVICE_CUDA = 2
} pooch_device;

/* Called after each step; return 0 to cancel the running call. */
typedef int (*pooch_progress_fn)(void* user, int64_t step, float loss);

/* How a train step that does not fit device_memory is made to fit: each
 * activation saved for the backward pass is kept, swapped to host memory and
 * prefetched back, or recomputed (docs/PLANNER.md). */
typedef enum pooch_strategy {
  POOCH_STRATEGY_KEEP = 0,            /* in core only: a step that does not fit is an error */
  POOCH_STRATEGY_SWAP_ALL = 1,
  POOCH_STRATEGY_RECOMPUTE_ALL = 2,
  POOCH_STRATEGY_CHECKPOINT_SQRT = 3,
  POOCH_STRATEGY_POOCH_GREEDY = 4,    /* PoocH's own search */
  POOCH_STRATEGY_AUTO = 5             /* the default: the fastest plan the simulator finds */
} pooch_strategy;

typedef struct pooch_session_params {
  pooch_device device;      /* default AUTO */
  size_t device_memory;     /* device budget in bytes; 0: all the device offers */
  int threads;              /* CPU threads; 0: all cores */
  pooch_optimizer optimizer;/* default ADAM */
  float learning_rate;      /* default 1e-3 */
  float beta1, beta2, eps;  /* Adam: 0.9, 0.999, 1e-8 */
  float weight_decay;       /* default 0 (AdamW: decoupled); gpt models: weights of rank 1
                               (biases, layernorms) do not decay */
  float momentum;           /* SGD: default 0.9 */
  int deterministic;        /* prefer bitwise reproducible kernels (default 1) */
  int resume;               /* a model from a checkpoint: continue its optimizer state and
                               trainer position (default 1); 0: its weights only. The
                               checkpoint's optimizer settings win over the ones above. */
  pooch_progress_fn progress;
  void* progress_user;
  int strategy;             /* a pooch_strategy (default AUTO; 0, KEEP, when zeroed by hand) */
  int plan_only;            /* 1: plan and report only (pooch_session_memory,
                               pooch_session_plan_json); no memory is taken and every call
                               that would run or touch tensors fails with
                               POOCH_ERR_UNSUPPORTED (default 0) */
  size_t host_memory;       /* cap on the host pool (staging and swapped activations); 0: none */
  double link_bandwidth;    /* CPU device only: an emulated device link, bytes/s (0: none) */
  double link_latency;      /* its latency per copy, seconds */
  const char* machine_file; /* a card's description (JSON, as the source's machines/ folder
                               holds; docs/PLANNER.md): plan for it instead of this device
                               (its memory is the budget unless device_memory is set; node
                               times from its roofline); NULL: none. Read during
                               pooch_session_create. */
  float clip_norm;          /* gradient clipping by global norm, as torch's clip_grad_norm_:
                               every gradient times min(1, clip_norm / (||g|| + 1e-6)),
                               ||g|| over all of them (default 0: none; models with a
                               row-sparse gradient, XMC sparse input layers, refuse it) */
  uint8_t reserved[20]; /* zero: room for new fields (see the top of this file) */
} pooch_session_params;

POOCH_API void pooch_session_default_params(pooch_session_params* p);
/* Plans the step (arena offsets for every tensor) and takes the arena. Fails
 * with POOCH_ERR_OUT_OF_BUDGET, naming the minimum budget, when it does not fit. */
POOCH_API pooch_status pooch_session_create(pooch_model* model, const pooch_session_params* p,
                                            pooch_session** out);
POOCH_API void pooch_session_free(pooch_session** session);

/* One batch: rows in CSR form (row_ptr has rows+1 entries; row r's features
 * are col/val[row_ptr[r] .. row_ptr[r+1]), columns < features; row_ptr[0]
 * need not be 0, so a batch can be a view into a larger set), and the labels
 * of each row in the same form (label_ptr, label ids < labels; may be NULL
 * for predict). rows <= batch_size. */
typedef struct pooch_batch {
  int64_t rows;
  const int64_t* row_ptr;
  const int32_t* col;
  const float* val;
  const int64_t* label_ptr;
  const int32_t* label;
  const float* dense; /* dense-input models: rows x input width, row-major (else NULL) */
} pooch_batch;

/* One forward, backward and optimizer update; *loss gets the batch loss
 * (loss may be NULL). */
POOCH_API pooch_status pooch_session_step(pooch_session* s, const pooch_batch* batch, float* loss);
/* Top-k labels per row: labels[rows*k] and scores[rows*k], best first.
 * Either may be NULL (that half is not written), not both. */
POOCH_API pooch_status pooch_session_predict(pooch_session* s, const pooch_batch* batch, int k,
                                             int32_t* labels, float* scores);
/* Tensor-level calls, for every model family. An input with a batch
 * dimension takes up to its planned rows: `bytes` may hold fewer whole rows,
 * and the rest are padded (with values the loss ignores). */
POOCH_API pooch_status pooch_session_set_input(pooch_session* s, const char* name,
                                               const void* data, size_t bytes);

typedef enum pooch_program {
  POOCH_PROGRAM_TRAIN_STEP = 0, /* forward, backward, optimizer update; the loss comes back */
  POOCH_PROGRAM_FORWARD = 1,    /* the model's outputs other than the loss (no labels needed) */
  POOCH_PROGRAM_EVALUATE = 2    /* every output, the loss included, with no update */
} pooch_program;

/* Runs one program on the inputs set last. Out of core, the second to the
 * fourth train step of a session are timed launch by launch, and the step is
 * then planned again from their times (the first runs cold and is not timed;
 * docs/PLANNER.md). */
POOCH_API pooch_status pooch_session_run(pooch_session* s, pooch_program program);
/* Copies an output computed by the last run; `bytes` must be its full size
 * (pooch_model_output_info). */
POOCH_API pooch_status pooch_session_get_output(const pooch_session* s, const char* name,
                                                void* data, size_t bytes);

/* Thread-safe: makes the running or next call on `s` return POOCH_ERR_CANCELLED. */
POOCH_API void pooch_session_cancel(pooch_session* s);

typedef struct pooch_memory_report {
  size_t arena_bytes;     /* the fixed device buffer the plan needs (its peak) */
  size_t by_role[5];      /* input, weight, activation, gradient, optimizer state */
  size_t budget;          /* the budget it was planned against */
  const char* backend;    /* "cpu" or "cuda" */
  size_t in_core_bytes;   /* the arena the train step needs in core */
  size_t swapped_bytes;   /* activations the train step swaps to host memory and back */
  size_t recomputed_bytes;/* activations it recomputes in the backward pass */
  size_t host_bytes;      /* the host pool it took */
  double predicted_step_seconds;    /* the simulator's step time for the plan */
  double predicted_in_core_seconds; /* the same for the step in core */
  int out_of_core;        /* 1 when the step swaps or recomputes to fit the budget */
  int strategy;           /* the pooch_strategy the plan came from */
  uint8_t reserved[8];    /* zeroed by the library: room for new fields */
} pooch_memory_report;

POOCH_API pooch_status pooch_session_memory(const pooch_session* s, pooch_memory_report* out);

/* The train step's plan as one JSON document (docs/PLANNER.md); free it with
 * pooch_string_free. Keys: "backend", "strategy" (the one the plan came
 * from), "out_of_core", "profile" ("estimated", "measured" or "machine"), "budget",
 * "backend_kept" (what the backend keeps for itself of a device_memory budget:
 * the CUDA backend's cuBLAS workspace; the plan's budget is the rest),
 * "in_core_arena", "arena" (what the step needs), "arena_taken",
 * "persistent_bytes", "host_pool" (taken), "host_bytes" (what the step
 * needs), "predicted_seconds", "predicted_in_core_seconds",
 * "compute_seconds", "host_launch_seconds" (the host kernels' time, which
 * the device waits for as it waits for copies), "swapped_bytes", "recomputed_bytes", "plans_tried",
 * "plan_seconds" (the out-of-core search's wall time), "paged_bytes" (weights
 * and optimizer state whose home is the host pool), "paged_copy_bytes" (what
 * a step copies for them, both ways); "paged": each paged tensor as {"name",
 * "bytes", "role"}; "repaged" (under auto, the measured steps changed what
 * is paged and moved the tensors) and "repage_seconds" (that planning and
 * the move);
 * "activations": every activation saved for the backward pass as {"name",
 * "bytes", "decision" ("keep", "swap", "recompute"), "producer",
 * "last_forward", "first_backward" (positions in the program),
 * "recomputable"}; "steps": one array per step in the order of
 * "step_fields": kind ("launch", "recompute" (a node's second launch),
 * "copy_in", "copy_out", "record", "wait"), stream ("compute", "d2h",
 * "h2d"), the op or the tensor copied, bytes (written or copied), simulated
 * start and end in seconds; "occupancy": per launch slot, an array in the
 * order of "occupancy_fields": the slot's simulated start and end, the
 * transient region's live bytes (it starts at "persistent_bytes") by kind:
 * input, activation, swapped (back on the device), recomputed, gradient,
 * workspace, their total, the highest byte in use ("top"), and paged weights and
 * optimizer state copied in ("paged", counted in the total); with a
 * machine_file, "machine": {"name", "file", "memory", "usable_memory", and
 * the achievable "flops", "memory_bandwidth", "h2d_bandwidth",
 * "d2h_bandwidth", "link_latency" the plan used}. Fails with
 * POOCH_ERR_UNSUPPORTED for a session without a train step. */
POOCH_API pooch_status pooch_session_plan_json(const pooch_session* s, char** json_out);

/* Profiles the train step: runs ONE REAL TRAINING STEP (the weights and the
 * optimizer state are updated) on the inputs set last,
 * each launch and copy timed on the device's clock (CUDA events; the CPU
 * backend's stream threads' clock); the step is then planned again from the
 * measured times (pooch_session_plan_json shows the new plan; under auto,
 * after the third measured step, the paging of weights and optimizer state
 * too: "repaged"). Each call adds
 * a run: the times are each op's median over the last 5 calls, so calling it
 * several times steadies the profile. Returns JSON
 * (free with pooch_string_free): "seconds" (the launches' sum), "step" (the
 * optimizer step counter after it), "ops": per graph node the step launches,
 * {"op", "node", "seconds", "flops", "bytes", "gflops"} (FLOPs and the bytes
 * the op reads and writes as the op registry counts them; achieved GFLOP/s). */
POOCH_API pooch_status pooch_session_profile_json(pooch_session* s, char** json_out);

/* Writes the session's model (spec and weights) to `path`, atomically. */
POOCH_API pooch_status pooch_session_save(const pooch_session* s, const char* path);

/* Copies the tensor `name` (e.g. "hidden.weight", "head.weight.m") out of the
 * arena into dst, which must hold exactly its size in bytes (*bytes gets the
 * size; pass dst NULL to ask for it). */
POOCH_API pooch_status pooch_session_read_tensor(const pooch_session* s, const char* name,
                                                 void* dst, size_t* bytes);
/* Copies `bytes` bytes from src into the weight or optimizer-state tensor
 * `name`; `bytes` must be exactly its size (pooch_session_read_tensor with
 * dst NULL tells it). What pooch_session_save writes next includes it (e.g.
 * weights merged from several trained sessions into one model). */
POOCH_API pooch_status pooch_session_write_tensor(pooch_session* s, const char* name,
                                                  const void* src, size_t bytes);

/* ---------------------------------------------------------------------- */
/* Data sets                                                              */

typedef struct pooch_dataset pooch_dataset;

/* A synthetic problem whose labels are predictable from the features: each
 * label owns `topic_features` features; each row draws 1-3 labels and carries
 * most of their features plus `noise_features` random ones. */
typedef struct pooch_planted_params {
  int64_t rows;       /* default 2048 */
  int64_t features;   /* default 1000 */
  int64_t labels;     /* default 200 */
  int topic_features; /* default 4 */
  int noise_features; /* default 3 */
  uint64_t seed;      /* default 1 */
  uint8_t reserved[64]; /* zero: room for new fields (see the top of this file) */
} pooch_planted_params;

POOCH_API void pooch_planted_default_params(pooch_planted_params* p);
POOCH_API pooch_status pooch_dataset_create_planted(const pooch_planted_params* p,
                                                    pooch_dataset** out);
POOCH_API void pooch_dataset_free(pooch_dataset** ds);
/* Any of rows, features and labels may be NULL. */
POOCH_API pooch_status pooch_dataset_shape(const pooch_dataset* ds, int64_t* rows,
                                           int64_t* features, int64_t* labels);
/* A view of rows [first, first + rows) (clipped at the end), valid while ds lives. */
POOCH_API pooch_status pooch_dataset_batch(const pooch_dataset* ds, int64_t first, int64_t rows,
                                           pooch_batch* out);
/* An Extreme Classification Repository bag-of-words file (header "N F L"),
 * with a binary cache beside it (<path>.pcache) that makes the next load fast;
 * errors name the file, line and column. */
POOCH_API pooch_status pooch_dataset_load(const char* path, pooch_dataset** out);
/* The split form: features X_Xf.txt (or dense features in a NumPy .npy file)
 * and labels X_Y.txt. */
POOCH_API pooch_status pooch_dataset_load_split(const char* features_path, const char* labels_path,
                                                pooch_dataset** out);
/* Writes a data set in the bag-of-words format, atomically. */
POOCH_API pooch_status pooch_dataset_save(const pooch_dataset* ds, const char* path);
/* Splits `ds` in two: `held_out` rows drawn at random by `seed` (the same
 * rows on every machine) into *held, the others into *rest, each keeping the
 * rows' order in ds (e.g. a validation part of a training set). held_out must
 * be in [0, rows]. Free both with pooch_dataset_free. */
POOCH_API pooch_status pooch_dataset_split(const pooch_dataset* ds, int64_t held_out,
                                           uint64_t seed, pooch_dataset** rest,
                                           pooch_dataset** held);
/* The most nonzeros any `batch_size` rows of `ds` hold together (the sum of
 * the largest row lengths): the max_nnz a model needs to take any batch of it,
 * shuffled or not (pooch_model_set_run_shape). */
POOCH_API int64_t pooch_dataset_max_batch_nnz(const pooch_dataset* ds, int64_t batch_size);
/* The same for labels: the most positive labels any `batch_size` rows of `ds`
 * hold together, the max_labels a model needs to train on any batch of it
 * (pooch_model_set_max_labels). */
POOCH_API int64_t pooch_dataset_max_batch_labels(const pooch_dataset* ds, int64_t batch_size);
/* 1 when the features are dense rows (from .npy). */
POOCH_API int pooch_dataset_is_dense(const pooch_dataset* ds);
/* A synthetic train/test pair shaped like a known data set ("EURLex-4K",
 * "Wiki10-31K", "AmazonCat-13K", "Wiki-500K", "Amazon-670K", "Amazon-3M"),
 * scaled by `scale` (rows and labels linearly). Power-law label frequencies;
 * the labels are predictable from the features. Deterministic in `seed`. */
POOCH_API pooch_status pooch_dataset_create_synth(const char* preset, double scale, uint64_t seed,
                                                  pooch_dataset** train, pooch_dataset** test);
/* The propensity parameters (A, B) of PSP@k for a data set name (Jain et al. 2016). */
POOCH_API void pooch_propensity_defaults(const char* dataset_name, float* a, float* b);

/* ---------------------------------------------------------------------- */
/* Generation (gpt models)                                                */

typedef struct pooch_generate_params {
  int64_t max_tokens; /* new tokens at most (default 32) */
  double temperature; /* 0: greedy; default 1 */
  int64_t top_k;      /* keep the k most likely tokens; 0 (default): all */
  double top_p;       /* keep the smallest set reaching this probability; 1 (default): all */
  uint64_t seed;      /* the same seed gives the same tokens (default 1) */
} pooch_generate_params;

POOCH_API void pooch_generate_default_params(pooch_generate_params* p);

/* Receives each new token as soon as it is sampled, with its index among the
 * new tokens (0-based); returns 0 to stop generation after it. */
typedef int (*pooch_token_fn)(void* user, int32_t token, int64_t index);

/* Continues `prompt` (prompt_len token ids in [0, vocabulary)) with up to
 * p->max_tokens tokens sampled from the session's model (family gpt) with
 * its current weights, one at a time over a KV cache kept in the session's
 * device memory (its size fixed by the context length), fewer when the
 * context fills or `on_token` (may be NULL) returns 0. The first
 * out_capacity new tokens are written to `out` (NULL with capacity 0: only
 * streamed) and their count to *out_len (may be NULL). Blocking; call it from
 * a worker thread to keep a GUI responsive (the callback runs on that
 * thread). Not safe to run concurrently with other calls on `s`. */
POOCH_API pooch_status pooch_generate(pooch_session* s, const int32_t* prompt, int64_t prompt_len,
                                      const pooch_generate_params* p, pooch_token_fn on_token,
                                      void* user, int32_t* out, int64_t out_capacity,
                                      int64_t* out_len);

/* ---------------------------------------------------------------------- */
/* Training and evaluation                                                */

typedef struct pooch_metrics {
  double precision[5]; /* P@1..P@5 (index k-1), in [0, 1] */
  double ndcg[5];
  double psp[5];       /* propensity-scored precision; 0 without propensities */
  int has_psp;
  int64_t rows;
  uint8_t reserved[64]; /* zeroed by the library: room for new fields */
} pooch_metrics;

typedef struct pooch_epoch_report {
  int epoch;            /* 1-based */
  double train_loss;    /* mean batch loss of the epoch */
  double seconds;       /* training and evaluation */
  double learning_rate; /* at the end of the epoch */
  int evaluated;        /* eval holds test-set metrics */
  pooch_metrics eval;
  int improved, reduced_lr, stopping;
} pooch_epoch_report;

typedef struct pooch_train_params {
  int epochs;               /* default 10 */
  int64_t warmup_steps;     /* linear learning-rate warm-up (default 0) */
  float plateau_factor;     /* reduce-on-plateau factor (default 0.5) */
  int plateau_patience;     /* epochs without improvement before reducing (default 2; 0: off) */
  int early_stop_patience;  /* epochs without improvement before stopping (default 4; 0: off) */
  int shuffle;              /* default 1 */
  uint64_t data_seed;       /* data order (default 1) */
  float psp_a, psp_b;       /* propensity parameters (default 0.55, 1.5) */
  const char* checkpoint_path; /* written after each epoch and when cancelled (NULL: never) */
  /* After each step (epoch 1-based; batch counts the batches of this epoch
   * done so far); return 0 to stop (the checkpoint is written, the call
   * returns POOCH_ERR_CANCELLED). */
  int (*on_step)(void* user, int64_t step, float loss, int epoch, int64_t batch, int64_t batches);
  void (*on_epoch)(void* user, const pooch_epoch_report* report);
  void* user;
  /* Dynamic sparse training of a fixed fan-in head: every rewire_every steps
   * (0, the default: never) the fraction rewire_fraction of each label's
   * connections with the smallest |w| is pruned and regrown at random inputs
   * (fan-in stays exact; regrown weights and their Adam moments start at 0). */
  int64_t rewire_every;
  float rewire_fraction;    /* default 0.1 */
  /* A session resumed from a checkpoint refuses (POOCH_ERR_BAD_INPUT, naming
   * both fingerprints) training data other than the data the checkpoint was
   * trained on, told by a hash of every row (checkpoint metadata
   * "train.data.fingerprint"); 1 allows it, and the run goes on with the new
   * data (default 0). */
  int allow_other_data;
  /* Training ends, as after its last epoch, once the optimizer has taken
   * this many steps in all, counted over resumes (default 0: the epochs
   * alone decide). */
  int64_t max_steps;
  /* A pooch_lr_schedule (default POOCH_LR_PLATEAU). */
  int lr_schedule;
  /* POOCH_LR_COSINE: the learning rate's floor, as a fraction of it, reached
   * at the run's last step (default 0.1). */
  float min_lr_ratio;
  uint8_t reserved[32]; /* zero: room for new fields (see the top of this file) */
} pooch_train_params;

/* How the learning rate moves over a run. Both start with the linear
 * warm-up of warmup_steps; reduce-on-plateau applies to both when
 * plateau_patience is nonzero. */
typedef enum pooch_lr_schedule {
  POOCH_LR_PLATEAU = 0, /* constant after the warm-up */
  POOCH_LR_COSINE = 1   /* then half a cosine down to min_lr_ratio at the last step (max_steps,
                           else epochs x batches per epoch), as GPT-2 and nanoGPT train */
} pooch_lr_schedule;

POOCH_API void pooch_train_default_params(pooch_train_params* p);
/* Trains (or, for a session from a checkpoint, resumes) over `train`;
 * evaluates on `test` (may be NULL) after each epoch. Stopping early through
 * on_step or pooch_session_cancel returns POOCH_ERR_CANCELLED after writing
 * the checkpoint. */
POOCH_API pooch_status pooch_train(pooch_session* s, const pooch_dataset* train,
                                   const pooch_dataset* test, const pooch_train_params* p);
/* Metrics of the session's top-5 predictions on `ds`. With `train` given,
 * PSP@k uses propensities from its label frequencies and (a, b). */
POOCH_API pooch_status pooch_evaluate(pooch_session* s, const pooch_dataset* ds,
                                      const pooch_dataset* train, float a, float b,
                                      pooch_metrics* out);

/* ---- Language models: tokenizer, token data, GPT-2 checkpoints ------------
 * (docs/FORMAT.md "Token files", "Byte-level BPE tokenizer files", "GPT-2
 * checkpoints of other programs"). */

/* GPT-2's byte-level BPE tokenizer, from vocab.json and merges.txt. */
typedef struct pooch_tokenizer pooch_tokenizer;
POOCH_API pooch_status pooch_tokenizer_load(const char* vocab_json, const char* merges_txt,
                                            pooch_tokenizer** out);
POOCH_API void pooch_tokenizer_free(pooch_tokenizer** t);
POOCH_API int64_t pooch_tokenizer_vocab_size(const pooch_tokenizer* t); /* -1 for NULL */
/* Encodes `len` bytes of UTF-8 text: writes min(count, cap) ids to `ids`
 * (NULL when cap is 0) and the count to *count; call again with a buffer of
 * *count ids when it is larger than cap. */
POOCH_API pooch_status pooch_tokenizer_encode(const pooch_tokenizer* t, const char* text,
                                              size_t len, int32_t* ids, int64_t cap,
                                              int64_t* count);
/* The bytes token `id` stands for (not NUL-terminated; a token may hold part
 * of a UTF-8 character, so a streaming caller writes bytes as they come).
 * They stay valid while the tokenizer lives. */
POOCH_API pooch_status pooch_tokenizer_token(const pooch_tokenizer* t, int32_t id,
                                             const char** bytes, size_t* len);

/* Token ids from a file: an llm.c token file (a 256 x int32 header with
 * magic 20240520, then uint16 tokens), or with `bytes` nonzero any file's
 * bytes as ids 0..255. Free *tokens with pooch_tokens_free. */
POOCH_API pooch_status pooch_tokens_load(const char* path, int bytes, int32_t** tokens,
                                         int64_t* count);
POOCH_API void pooch_tokens_free(int32_t** tokens);
/* Writes ids (each in [0, 65535]) as an llm.c token file, atomically. */
POOCH_API pooch_status pooch_tokens_save(const char* path, const int32_t* tokens, int64_t count);

/* Tokens per training row of a gpt model (1 to its context length n_ctx;
 * 0: n_ctx), as pooch_model_set_run_shape sets the rows per step. The
 * weights are kept. POOCH_ERR_INVALID_ARG for other families or a length
 * outside that range. */
POOCH_API pooch_status pooch_model_set_sequence_length(pooch_model* model, int64_t tokens);

/* LoRA finetuning of a gpt model: adds rank-`rank` adapters to the linears
 * `targets` names ("attn": attn.c_attn and attn.c_proj; "mlp": mlp.c_fc and
 * mlp.c_proj; "attn,mlp"; NULL: "attn"), y = x·Wᵀ + b + (alpha/rank)·x·Aᵀ·Bᵀ,
 * and freezes every base weight: a session then trains the adapters only
 * (no gradient or optimizer state for the rest). A starts as PyTorch's
 * Kaiming-uniform default, B at zero, so the model starts as it was.
 * `alpha` 0 means alpha = rank. The model's weights are kept; a checkpoint
 * loaded this way starts over (its optimizer state is for the base
 * weights). POOCH_ERR_INVALID_ARG for other families, a model that already
 * has adapters, rank outside 1..min(n_embd, 65536) or an unknown target. */
POOCH_API pooch_status pooch_model_add_lora(pooch_model* model, int64_t rank, double alpha,
                                            const char* targets);
/* Folds the adapters of a LoRA-finetuned gpt model or checkpoint into its
 * weights (W + (alpha/rank)·B·A) and writes the plain model to out_path,
 * atomically: it computes the same function without the adapters' work,
 * and exports to Hugging Face. POOCH_ERR_BAD_INPUT naming the file when it
 * has no adapters. */
POOCH_API pooch_status pooch_lora_merge(const char* model_path, const char* out_path);

typedef struct pooch_lm_params {
  double val_fraction; /* the stream's tail held out for validation (default 0.1; 0: none) */
  int64_t eval_every;  /* validate every this many steps too (default 0: after each epoch only) */
  /* Each validation: the optimizer step, the mean cross-entropy per token
   * (nats) over the held-out windows, and its exp (perplexity). `user` is
   * the pooch_train_params' user. May be NULL. */
  void (*on_eval)(void* user, int64_t step, double loss, double perplexity);
  uint8_t reserved[64]; /* zero: room for new fields (see the top of this file) */
} pooch_lm_params;

POOCH_API void pooch_lm_default_params(pooch_lm_params* p);
/* Trains a gpt session (or resumes it, from a checkpoint) on one stream of
 * `count` token ids, each in [0, vocabulary): non-overlapping windows of the
 * model's sequence length + 1 tokens (inputs, and targets shifted by one),
 * in a seeded order per epoch (p->data_seed), with the last
 * lm->val_fraction of the stream held out for validation. The epoch reports'
 * `eval` stays zero (lm->on_eval has the validation figures) and the score
 * for plateau and early stopping is the negated validation loss. Checkpoints,
 * cancellation and bit-exact resume as pooch_train; a resumed session
 * refuses other tokens than its checkpoint trained on unless
 * p->allow_other_data (the fingerprint hashes every id). A token id
 * outside the vocabulary, or too few tokens for a training and a validation
 * window, is POOCH_ERR_BAD_INPUT naming the index and value or the counts;
 * a session of another family POOCH_ERR_INVALID_ARG. */
POOCH_API pooch_status pooch_train_tokens(pooch_session* s, const int32_t* tokens, int64_t count,
                                          const pooch_train_params* p,
                                          const pooch_lm_params* lm);

/* GPT-2 checkpoints of other programs. Import reads a Hugging Face directory
 * (config.json + model.safetensors, as GPT2LMHeadModel.save_pretrained
 * writes) or an llm.c gpt2_*.bin, tensor by tensor, and writes a pooch gpt
 * model file. Export writes a gpt model file as config.json +
 * model.safetensors that GPT2LMHeadModel.from_pretrained loads. */
POOCH_API pooch_status pooch_gpt_import(const char* from, const char* out_path);
POOCH_API pooch_status pooch_gpt_export(const char* model_path, const char* out_dir);

/* torchvision convolutional networks (resnet, vgg). Import reads a state
 * dict saved as safetensors (safetensors.torch.save_file(
 * torchvision.models.resnet50().state_dict(), path)) tensor by tensor and
 * writes a pooch model file. `spec_json` (may be NULL) holds spec fields to
 * use (family, depth, input, batch, normalize, ...); the rest come from the
 * tensors' names and shapes. A file whose names or shapes do not fit the
 * model is refused (POOCH_ERR_BAD_INPUT naming the first tensor that does
 * not). With `spec_out` not NULL, *spec_out gets the model's spec as JSON
 * (free with pooch_string_free). Export writes a resnet or vgg model file's
 * weights as such a state dict. */
POOCH_API pooch_status pooch_cnn_import(const char* from, const char* spec_json,
                                        const char* out_path, char** spec_out);
POOCH_API pooch_status pooch_cnn_export(const char* model_path, const char* out_path);

#ifdef __cplusplus
}
#endif
#endif /* POOCH_H */
