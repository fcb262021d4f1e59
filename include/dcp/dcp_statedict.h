/*
 * dcp_statedict.h: model and optimizer state for C trainers (AdamW, and
 * torch's other optimizers or any per-parameter state: see "Any optimizer"
 * below), under the keys PyTorch's get_state_dict gives them, and
 * flat-buffer sharding.
 *
 * PyTorch names model and optimizer state by fully qualified parameter
 * names (FQNs), whatever the parallelism, so that a checkpoint can be
 * resharded. For a model with torch.optim.AdamW, the state
 * {"model": model_sd, "optim": optim_sd} that torch's recipes save holds
 * (checked against torch 2.13):
 *
 *   model.<fqn>                          the parameter, its real shape
 *   optim.state.<fqn>.step               0-d float32 tensor: steps taken
 *   optim.state.<fqn>.exp_avg            parameter's shape and dtype
 *   optim.state.<fqn>.exp_avg_sq         parameter's shape and dtype
 *   optim.param_groups.<g>.lr            float       (g: group index)
 *   optim.param_groups.<g>.betas         (float, float)
 *   optim.param_groups.<g>.eps           float
 *   optim.param_groups.<g>.weight_decay  float
 *   optim.param_groups.<g>.amsgrad       False
 *   optim.param_groups.<g>.maximize      False
 *   optim.param_groups.<g>.foreach       None
 *   optim.param_groups.<g>.capturable    False
 *   optim.param_groups.<g>.differentiable  False
 *   optim.param_groups.<g>.fused         None
 *   optim.param_groups.<g>.decoupled_weight_decay  True
 *   optim.param_groups.<g>.params        [fqn, ...] of the group
 *
 * A dcp_sd describes such a model and optimizer (parameters in the order
 * of one flat parameter space, in AdamW parameter groups) and adds exactly
 * these entries to a dcp_state. A checkpoint a C trainer saves this way
 * loads into PyTorch with
 *     state = {"model": msd, "optim": osd} from get_state_dict(model, optim)
 *     torch.distributed.checkpoint.load(state, checkpoint_id=path)
 *     set_state_dict(model, optim, model_state_dict=state["model"],
 *                    optim_state_dict=state["optim"])
 * and a checkpoint PyTorch saves from that state loads into the C trainer
 * (dcp_sd_load), on any number of ranks.
 *
 * Flat-buffer sharding (ZeRO-1 / FSDP1 style). The parameters, in the order
 * they were added, form one flat space of dcp_sd_numel elements; parameter
 * i occupies [dcp_sd_param_offset(i), + its element count), its elements in
 * row-major (C) order. A rank binds the part it holds as one slice
 * [begin, end) of that space (dcp_sd_bind_model for the parameters,
 * dcp_sd_bind_optim for exp_avg and exp_avg_sq); slices may start and end
 * anywhere, inside a parameter, inside a row. dcp stores every tensor with
 * its real shape: the part of a parameter a slice covers is cut into the
 * boxes dcp_range_boxes gives (whole rows in the middle, partial rows at
 * the two ends), so the checkpoint reshards to any other slicing, any
 * other world size, and to PyTorch's plain or DTensor parameters.
 *
 * Conventions are those of dcp.h: 0 or a negative DCP_E* code, out
 * parameters set on failure, NULL frees are no-ops. A dcp_sd is not thread
 * safe (one thread at a time); different ones may be used at once. Only
 * dcp_sd_load is collective.
 */
#ifndef DCP_DCP_STATEDICT_H
#define DCP_DCP_STATEDICT_H

#include <stddef.h>
#include <stdint.h>

#include "dcp.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------------- */
/* Row-major ranges as boxes                                              */
/* ---------------------------------------------------------------------- */

/* Most boxes dcp_range_boxes ever returns (2 * ndim - 1, at least 1). */
#define DCP_RANGE_MAX_BOXES (2 * DCP_MAX_NDIM - 1)

/* One box of a tensor: offsets and sizes (ndim elements used), and begin,
 * the row-major index of its first element in the whole tensor. */
typedef struct dcp_box {
    int64_t offsets[DCP_MAX_NDIM];
    int64_t sizes[DCP_MAX_NDIM];
    int64_t begin;
} dcp_box;

/*
 * Cuts the elements [begin, end) of a tensor of the given shape, counted in
 * row-major order, into the fewest boxes: a partial row, whole rows, whole
 * planes, ... and back down to a partial row, at most 2 * ndim - 1 boxes
 * (1 for ndim 0). The boxes come in row-major order and are contiguous in
 * it: box k covers the elements [boxes[k].begin, boxes[k].begin +
 * its element count), box k + 1 starts where box k ends, so a buffer
 * holding elements [begin, end) holds box k at element boxes[k].begin -
 * begin. An empty range gives no boxes.
 *  - ndim: 0..DCP_MAX_NDIM; shape: ndim sizes >= 0 (NULL when ndim is 0).
 *  - boxes: room for cap boxes; DCP_RANGE_MAX_BOXES is always enough.
 *  - *nboxes: receives the count (0 on failure).
 * Returns DCP_OK, or DCP_EINVAL (bad ndim, a negative size, an element
 * count above INT64_MAX, 0 <= begin <= end <= element count violated,
 * NULL pointers, cap too small). Pure function: thread safe, not
 * collective.
 */
DCP_API int dcp_range_boxes(int ndim, const int64_t *shape, int64_t begin,
                            int64_t end, dcp_box *boxes, size_t cap,
                            size_t *nboxes);

/* ---------------------------------------------------------------------- */
/* Model + AdamW state                                                    */
/* ---------------------------------------------------------------------- */

typedef struct dcp_sd dcp_sd;

/*
 * Hyper-parameters of one AdamW parameter group, as torch.optim.AdamW has
 * them (amsgrad and maximize off, decoupled weight decay). Set struct_size
 * = sizeof(dcp_adamw); dcp_adamw_defaults fills in torch's defaults.
 */
typedef struct dcp_adamw {
    uint32_t struct_size;
    double lr;
    double beta1;
    double beta2;
    double eps;
    double weight_decay;
} dcp_adamw;

/* torch.optim.AdamW's defaults: lr 1e-3, betas (0.9, 0.999), eps 1e-8,
 * weight_decay 1e-2; sets struct_size. NULL is a no-op. */
DCP_API void dcp_adamw_defaults(dcp_adamw *hp);

/*
 * Creates an empty description. dtype: the parameters' element type, also
 * that of exp_avg and exp_avg_sq (torch keeps them in the parameter's
 * dtype); the step tensors are float32 whatever it is.
 * Returns DCP_OK, DCP_EINVAL (NULL out, unknown dtype), DCP_ENOMEM.
 */
DCP_API int dcp_sd_create(dcp_sd **out, dcp_dtype dtype);

/* Frees sd. States it was added to must not be saved or loaded after. */
DCP_API void dcp_sd_free(dcp_sd *sd);

/*
 * Adds parameter group number dcp_sd_group_count(sd) (0, 1, ...) with
 * hyper-parameters hp (copied).
 * Returns DCP_OK, DCP_EINVAL (NULL, struct_size too small, a value
 * non-finite or negative, a beta outside [0, 1), the parameters already
 * bound or added to a state), DCP_ENOMEM.
 */
DCP_API int dcp_sd_add_group(dcp_sd *sd, const dcp_adamw *hp);

/*
 * Adds parameter fqn (copied; e.g. "fc1.weight", as named_parameters()
 * names it) to group g, at the end of the flat parameter space (groups
 * may interleave there: a weight of group 0, its bias in group 1, ...).
 *  - ndim: 0..DCP_MAX_NDIM; shape: its sizes (NULL when ndim is 0).
 * Returns DCP_OK, DCP_EINVAL (g not a group, empty or repeated fqn, bad
 * ndim or shape, the flat space beyond INT64_MAX bytes, the parameters
 * already bound or added to a state), DCP_ENOMEM.
 */
DCP_API int dcp_sd_add_param(dcp_sd *sd, size_t g, const char *fqn, int ndim,
                             const int64_t *shape);

/* Counts, and parameter i's offset in the flat space (-1 when i is out of
 * range). */
DCP_API size_t dcp_sd_group_count(const dcp_sd *sd);
DCP_API size_t dcp_sd_param_count(const dcp_sd *sd);
DCP_API int64_t dcp_sd_numel(const dcp_sd *sd);
DCP_API int64_t dcp_sd_param_offset(const dcp_sd *sd, size_t i);

/*
 * The slice [begin, end) of the flat parameter space this rank holds:
 * buf holds its elements (end - begin of them, C order, little-endian,
 * host memory), borrowed until the states the sd was added to are no
 * longer saved or loaded. A save writes them, a load fills them; the
 * previous binding is replaced. begin == end (buf may then be NULL) binds
 * nothing: this rank saves and loads no parameter elements. Parameters
 * entirely outside the slice are left out of this rank's state.
 * Returns DCP_OK, DCP_EINVAL (NULL sd, 0 <= begin <= end <= numel
 * violated, NULL buf for a non-empty slice).
 */
DCP_API int dcp_sd_bind_model(dcp_sd *sd, int64_t begin, int64_t end,
                              void *buf);

/*
 * The same for the optimizer state: exp_avg and exp_avg_sq hold the
 * elements [begin, end) of the flat space of first and second moments.
 * Independent of the model binding (ZeRO-1 saves each rank's slice of both;
 * loads every parameter on every rank and its slice of the moments).
 * Returns as dcp_sd_bind_model.
 */
DCP_API int dcp_sd_bind_optim(dcp_sd *sd, int64_t begin, int64_t end,
                              void *exp_avg, void *exp_avg_sq);

/*
 * The optimizer's step count (0 when created): saved as every parameter's
 * state.<fqn>.step (a generic sd: only when its layout has a step; frozen
 * parameters have none), a float32 as torch keeps it, so at most 2^24
 * (16777216) is allowed; dcp_sd_load sets it from the checkpoint.
 * Returns DCP_OK, DCP_EINVAL (NULL, negative, above 2^24).
 */
DCP_API int dcp_sd_set_step(dcp_sd *sd, int64_t step);
DCP_API int64_t dcp_sd_step(const dcp_sd *sd);

/*
 * Reads or replaces group g's hyper-parameters (a learning-rate schedule
 * sets lr before each save). Returns DCP_OK, DCP_EINVAL (NULL, g out of
 * range, values as dcp_sd_add_group refuses, struct_size too small).
 */
DCP_API int dcp_sd_hparams(const dcp_sd *sd, size_t g, dcp_adamw *out);
DCP_API int dcp_sd_set_hparams(dcp_sd *sd, size_t g, const dcp_adamw *hp);

/*
 * Adds the sd's entries to st at its current path, as two stateful
 * entries (dcp_state_add_stateful) whose contents are produced at each
 * save or load from the sd as it is then (bindings, step,
 * hyper-parameters), so one state serves every save of a training run:
 *  - model_key (e.g. "model"): the parameters, "<model_key>.<fqn>";
 *  - optim_key (e.g. "optim"): the AdamW state and param_groups.
 * Either may be NULL to leave that part out (not both). The rest of st
 * (the caller's own entries: data loader position, RNG, ...) is saved and
 * loaded with them. A state holding the sd saves with dcp_save or
 * dcp_save_async, and loads with dcp_sd_load. After the first call, the
 * parameters and groups are fixed.
 * Every rank adds the step of every parameter (a replicated 0-d tensor)
 * and the param_groups values; tensor boxes only for its bindings.
 * Returns DCP_OK, DCP_EINVAL (NULL sd or st, both keys NULL, an empty key,
 * equal keys, no parameters, a key already used in st: then st is left as
 * it was), DCP_ENOMEM. Not collective.
 */
DCP_API int dcp_sd_add_to_state(dcp_sd *sd, dcp_state *st,
                                const char *model_key, const char *optim_key);

enum dcp_sd_load_flags {
    /*
     * Take the checkpoint's lr, betas, eps and weight_decay (read them back
     * with dcp_sd_hparams) instead of requiring them equal to the sd's: for
     * a learning-rate schedule, or a run whose hyper-parameters changed.
     * amsgrad, maximize, decoupled_weight_decay and every group's
     * parameters must still match.
     */
    DCP_SD_LOAD_HPARAMS = 1 << 0
};

/*
 * Loads path into st, a state the sd was added to (dcp_sd_add_to_state):
 * the parameters into the model binding, the moments into the optimizer
 * binding, the step into dcp_sd_step, the caller's own entries as dcp_load
 * does. Collective over ctx's communicator (every rank with its own
 * bindings; the same parameters, groups and keys on every rank, checked).
 *
 * Before any buffer changes, rank 0 checks the checkpoint against the
 * description and every rank returns its verdict:
 *  - DCP_EKEY: keys under the sd's keys that are missing from the
 *    checkpoint, or in it and not in the model (another model: other or
 *    more layers, other names, more param groups; group fields torch adds
 *    beside AdamW's own, such as an LR scheduler's initial_lr); the
 *    message names them and dcp_load_report lists them all;
 *  - DCP_EMISMATCH: a parameter or moment of another shape or dtype
 *    (dtype allowed with DCP_LOAD_CAST), a value where a tensor belongs,
 *    hyper-parameters other than the sd's (see DCP_SD_LOAD_HPARAMS; the
 *    message gives both values), a group holding other parameters,
 *    amsgrad or maximize on, decoupled_weight_decay off, step counts that
 *    differ between parameters or are not whole numbers; the message names
 *    the keys.
 * The sd's keys are always checked strictly against the description;
 * opts (NULL for defaults) apply to the load itself, where a key counts as
 * asked for when some rank's binding reaches it: a parameter no rank
 * binds is an unexpected key to dcp_load unless DCP_LOAD_PARTIAL is set
 * (which also relaxes the caller's other keys).
 * Returns, on every rank the same code: DCP_OK, those two, and every code
 * of dcp_metadata_open and dcp_load (DCP_EINVAL also when st holds no
 * entry of sd, flags has unknown bits, or the ranks' descriptions differ).
 * Rank 0 reads .metadata twice (once for the check, once in dcp_load) and
 * the step and param_groups records once more.
 * For a generic sd (dcp_sd_create_optim) the same, with the layout's
 * keys: each state tensor in its own shape (dcp_sd_state_kind) for each
 * parameter that has it, "step" and the scalars as 0-d float32, every
 * value of each group's dict compared as saved (the same type and bits;
 * an int and a float of equal value count as equal; foreach and fused
 * too) unless DCP_SD_LOAD_HPARAMS takes them all (read them back with
 * dcp_sd_group_values; in the flat layout a group's parameters must then
 * agree), and the params lists (nested layout) always; frozen parameters
 * have no optimizer keys, and the flat layout's keys are not the nested
 * one's (DCP_EKEY).
 * With a plain dcp_load instead, the same load happens with dcp_load's own
 * checks (the first bad key only); hyper-parameters and step counts are
 * checked only once the data landed, failing the load with DCP_EMISMATCH
 * (dcp_sd_errmsg says why).
 */
DCP_API int dcp_sd_load(dcp_ctx *ctx, dcp_sd *sd, dcp_state *st,
                        const char *path, const dcp_load_options *opts,
                        unsigned flags);

/* Why the sd's last callback inside a plain dcp_load failed ("" when it did
 * not). Owned by sd, valid until its next use. */
DCP_API const char *dcp_sd_errmsg(const dcp_sd *sd);

/* ---------------------------------------------------------------------- */
/* Any optimizer: a generic description, torch's optimizers as presets    */
/* ---------------------------------------------------------------------- */

/*
 * Added after dcp 0.1.0 (issue 17; appended API, the AdamW one above
 * unchanged). Beside the AdamW description above, an sd can
 * describe any optimizer whose torch state_dict() holds, per parameter,
 * state tensors of the parameter's shape and dtype, 0-d float32 scalars
 * (such as "step" and NAdam's "mu_product"), and, per parameter group,
 * hyper-parameters of any Python type. The layout torch 2.13 writes:
 *
 *   nested (get_state_dict's default)      flat (flatten_optimizer_state_
 *                                           dict=True, as torchtitan saves)
 *   optim.state.<fqn>.step                 optim.state.<fqn>.step
 *   optim.state.<fqn>.<tensor>             optim.state.<fqn>.<tensor>
 *   optim.param_groups.<g>.<hp>            optim.param_groups.<fqn>.<hp>
 *   optim.param_groups.<g>.params          (none: each parameter carries
 *                                           its group's values)
 *
 * The presets (dcp_sd_optim_preset) give, for torch 2.13 (checked against
 * it), per parameter and in torch's param_groups order:
 *
 *   kind       state (besides step)            hyper-parameters
 *   SGD        momentum_buffer (MOMENTUM;      lr momentum dampening
 *              no step, no state without)      weight_decay nesterov maximize
 *                                              foreach differentiable fused
 *   ADAM,      exp_avg exp_avg_sq              lr betas eps weight_decay
 *   ADAMW      max_exp_avg_sq (AMSGRAD)        amsgrad maximize foreach
 *                                              capturable differentiable fused
 *                                              decoupled_weight_decay
 *   ADAGRAD    sum                             lr lr_decay eps weight_decay
 *                                              initial_accumulator_value
 *                                              foreach maximize differentiable
 *                                              fused
 *   RMSPROP    square_avg, momentum_buffer     lr momentum alpha eps centered
 *              (MOMENTUM), grad_avg (CENTERED) weight_decay capturable foreach
 *                                              maximize differentiable
 *   ADADELTA   square_avg acc_delta            lr rho eps weight_decay maximize
 *                                              capturable foreach
 *                                              differentiable
 *   ADAMAX     exp_avg exp_inf                 lr betas eps weight_decay
 *                                              foreach maximize differentiable
 *                                              capturable
 *   NADAM      scalar mu_product, exp_avg      lr betas eps weight_decay
 *              exp_avg_sq                      momentum_decay
 *                                              decoupled_weight_decay maximize
 *                                              foreach capturable
 *                                              differentiable
 *   RADAM      exp_avg exp_avg_sq              lr betas eps weight_decay
 *                                              maximize foreach capturable
 *                                              decoupled_weight_decay
 *                                              differentiable
 *   ADAFACTOR  row_var, col_var (parameters    lr beta2_decay eps (a tuple
 *              of 2 or more dims), variance    (None, 1e-3)) d weight_decay
 *              (the others)                    foreach maximize
 *
 * with torch's default values and Python types (betas a tuple of two
 * floats, foreach and fused None, flags bool; a default of 0 is the int 0
 * as torch keeps it).
 *
 * Use: dcp_sd_optim_preset (or fill a dcp_sd_optim by hand for another
 * optimizer), dcp_sd_create_optim, dcp_sd_add_group_values per group (the
 * preset's dict, edited with dcp_value_dict_set), dcp_sd_add_param,
 * dcp_sd_bind_model, dcp_sd_bind_state, then dcp_sd_add_to_state and
 * dcp_save / dcp_sd_load exactly as for AdamW. dcp_sd_add_group,
 * dcp_sd_bind_optim, dcp_sd_hparams and dcp_sd_set_hparams return
 * DCP_EINVAL on such an sd; dcp_sd_group_values and friends return
 * DCP_EINVAL (NULL) on an AdamW one.
 */

typedef enum dcp_optim_kind {
    DCP_OPTIM_SGD = 1,
    DCP_OPTIM_ADAM = 2,
    DCP_OPTIM_ADAMW = 3,
    DCP_OPTIM_ADAGRAD = 4,
    DCP_OPTIM_RMSPROP = 5,
    DCP_OPTIM_ADADELTA = 6,
    DCP_OPTIM_ADAMAX = 7,
    DCP_OPTIM_NADAM = 8,
    DCP_OPTIM_RADAM = 9,
    DCP_OPTIM_ADAFACTOR = 10
} dcp_optim_kind;

/* dcp_sd_optim.tensor_kinds: which parameters have a state tensor, and
 * its shape. */
typedef enum dcp_sd_state_kind {
    DCP_SD_STATE_PARAM = 0,      /* every parameter; its shape */
    DCP_SD_STATE_ROW = 1,        /* parameters of ndim >= 2; their shape
                                    with the last dim 1 (Adafactor's
                                    row_var) */
    DCP_SD_STATE_COL = 2,        /* parameters of ndim >= 2; their shape
                                    with dim ndim - 2 set to 1 (col_var) */
    DCP_SD_STATE_UNFACTORED = 3  /* parameters of ndim < 2; their shape
                                    (Adafactor's variance) */
} dcp_sd_state_kind;

/* Options of a preset that change the state torch keeps. */
enum dcp_optim_variant {
    DCP_OPTIM_MOMENTUM = 1 << 0, /* SGD, RMSPROP: momentum 0.9 (a float),
                                    a momentum_buffer per parameter */
    DCP_OPTIM_AMSGRAD = 1 << 1,  /* ADAM, ADAMW: amsgrad True,
                                    max_exp_avg_sq */
    DCP_OPTIM_CENTERED = 1 << 2  /* RMSPROP: centered True, grad_avg */
};

/* dcp_sd_optim.flags */
enum dcp_sd_optim_flags {
    DCP_SD_FLAT = 1 << 0 /* the flattened layout (see above) */
};

/* Most state tensors, and most scalars, of one description. */
#define DCP_SD_OPTIM_MAX_STATE 8

/*
 * The per-parameter state of an optimizer. Set struct_size =
 * sizeof(dcp_sd_optim). Names are borrowed for the call that reads them
 * (dcp_sd_create_optim copies them); they must be non-empty, without '.',
 * distinct from each other and from "step".
 */
typedef struct dcp_sd_optim {
    uint32_t struct_size;
    unsigned flags;      /* DCP_SD_FLAT or 0 */
    int step;            /* nonzero: a 0-d float32 "step" per parameter,
                            set by dcp_sd_set_step */
    size_t ntensors;     /* 0..DCP_SD_OPTIM_MAX_STATE */
    const char *tensors[DCP_SD_OPTIM_MAX_STATE]; /* the parameter's shape
                                                    and dtype */
    size_t nscalars;     /* 0..DCP_SD_OPTIM_MAX_STATE */
    const char *scalars[DCP_SD_OPTIM_MAX_STATE]; /* 0-d float32 each */
    dcp_sd_state_kind tensor_kinds[DCP_SD_OPTIM_MAX_STATE]; /* of tensors
                                    (0: DCP_SD_STATE_PARAM) */
} dcp_sd_optim;

/*
 * torch 2.13's state layout for kind with the variant's options (bits of
 * dcp_optim_variant; others, or one the kind has not, are DCP_EINVAL) into
 * *layout (struct_size set, flags 0, names static), and, when group is
 * not NULL, a new dict of the group's hyper-parameters with torch's
 * defaults into *group (the caller frees it with dcp_value_free; "params"
 * is not in it). Returns DCP_OK, DCP_EINVAL (unknown kind, bad variant,
 * NULL layout), DCP_ENOMEM. Thread safe, not collective.
 */
DCP_API int dcp_sd_optim_preset(dcp_optim_kind kind, unsigned variant,
                                dcp_sd_optim *layout, dcp_value **group);

/*
 * Creates an empty description of a model and an optimizer with this
 * per-parameter state (copied). dtype: the parameters' and the state
 * tensors' element type. Returns DCP_OK, DCP_EINVAL (NULL out or layout,
 * struct_size too small, unknown dtype or flags, bad names or counts),
 * DCP_ENOMEM.
 */
DCP_API int dcp_sd_create_optim(dcp_sd **out, dcp_dtype dtype,
                                const dcp_sd_optim *layout);

/*
 * Adds parameter group dcp_sd_group_count(sd) with the hyper-parameters
 * in group: a dict of str keys (copied; no "params", which dcp fills
 * from the parameters added to the group), saved as they are.
 * Returns DCP_OK, DCP_EINVAL (an AdamW sd, NULL, not a dict, a non-str or
 * empty key, a key with '.', "params", the parameters already bound or
 * added to a state), DCP_ENOMEM. Not collective.
 */
DCP_API int dcp_sd_add_group_values(dcp_sd *sd, const dcp_value *group);

/* Group g's dict (owned by sd, valid until the sd's next change of it),
 * or NULL (NULL sd, an AdamW sd, g out of range). After dcp_sd_load with
 * DCP_SD_LOAD_HPARAMS it holds the checkpoint's values. */
DCP_API const dcp_value *dcp_sd_group_values(const dcp_sd *sd, size_t g);

/* Replaces group g's dict (copied; same keys as before, in any order, a
 * learning-rate schedule changing lr). Returns DCP_OK, DCP_EINVAL (as
 * dcp_sd_add_group_values; g out of range; other keys), DCP_ENOMEM. */
DCP_API int dcp_sd_set_group_values(dcp_sd *sd, size_t g,
                                    const dcp_value *group);

/*
 * Marks parameter i frozen (requires_grad=False) or not: it stays in the
 * model and in the flat space, but has no optimizer state and is in no
 * group's params, as in torch when the optimizer was built from the
 * trainable parameters only. Only on a generic sd, before it is bound
 * or added to a state. Returns DCP_OK, DCP_EINVAL.
 */
DCP_API int dcp_sd_set_param_frozen(dcp_sd *sd, size_t i, int frozen);

/*
 * The optimizer state this rank holds: bufs[k] holds elements [begin, end)
 * of the flat space of state tensor k (the layout's tensors, in its order),
 * as dcp_sd_bind_model's buf (borrowed, C order, host memory; frozen
 * parameters' elements, and those of parameters without tensor k, are
 * there and left alone). bufs may be NULL when begin == end or the layout
 * has no tensors.
 * Tensors of kind DCP_SD_STATE_ROW or _COL are not cut: bufs[k] holds
 * the whole of their own flat space (dcp_sd_state_numel elements, tensor k
 * of parameter i at dcp_sd_state_offset), and this rank saves and loads
 * the tensor k of every parameter whose elements [begin, end) reaches,
 * whole (ranks that share a parameter must hold the same values).
 * Returns DCP_OK, DCP_EINVAL (an AdamW sd, the range as
 * dcp_sd_bind_model refuses, a NULL buffer for a non-empty slice).
 */
DCP_API int dcp_sd_bind_state(dcp_sd *sd, int64_t begin, int64_t end,
                              void *const *bufs);

/*
 * The flat space of state tensor k: its element count (dcp_sd_numel for
 * kinds PARAM and UNFACTORED; the sum of the row or column factors'
 * counts for ROW and COL), and where parameter i's tensor k starts in it
 * (-1 when parameter i has no tensor k, or k or i is out of range).
 * 0 / -1 on an AdamW sd. Not collective.
 */
DCP_API int64_t dcp_sd_state_numel(const dcp_sd *sd, size_t k);
DCP_API int64_t dcp_sd_state_offset(const dcp_sd *sd, size_t k, size_t i);

/*
 * Scalar name (one of the layout's scalars) of parameter i: read, or set
 * (0 until set; dcp_sd_load sets them; a save writes them). Setting one
 * fixes the parameters and groups, as binding does. Frozen parameters'
 * scalars are neither saved nor loaded. Returns DCP_OK, DCP_EINVAL (an
 * AdamW sd, NULL, unknown name, i out of range), DCP_ENOMEM (the first
 * set, when the scalar storage cannot be made).
 */
DCP_API int dcp_sd_scalar(const dcp_sd *sd, const char *name, size_t i,
                          float *out);
DCP_API int dcp_sd_set_scalar(dcp_sd *sd, const char *name, size_t i,
                              float value);

#ifdef __cplusplus
}
#endif

#endif /* DCP_DCP_STATEDICT_H */
