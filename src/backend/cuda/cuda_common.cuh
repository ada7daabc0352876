/* cuda_common.cuh — what every CUDA kernel file of the backend shares: the error-check macro, the
 * device view of a weight matrix (dmat), warp reductions and the launch wrappers each .cu exports.
 *
 * Conventions: activations, residual stream, norms, softmax, DeltaNet state in fp32; weights as
 * uploaded (MLX affine 4/8-bit words with bf16 scale/bias per group of 64, or bf16); KV cache bf16 (fp32 in
 * exact mode, lily_backend_options.exact: then only fp32 kernels run, see the `exact` fields below).
 * Every launch wrapper returns cudaError_t (the launch error); the backend turns it into a lily_status.
 */
#ifndef LILY_CUDA_COMMON_CUH
#define LILY_CUDA_COMMON_CUH

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>

extern "C" {
#include "lily.h"
}

/* Record a CUDA failure as LILY_ERR_BACKEND / LILY_ERR_OUT_OF_MEMORY naming the call (cuda_backend.cu). */
lily_status lily_cuda_error(lily_error *err, cudaError_t e, const char *call, const char *file, int line);

/* A weight matrix (or a stack of expert matrices) on the device.
 * bits 4/8: data = uint32 words, row r at data + r*row_bytes; scales/biases bf16, cols/64 per row.
 * bits 16: data = bf16 [rows][cols]. Expert e's row r is physical row e*rows + r. */
struct dmat {
    const uint8_t *data;
    const __nv_bfloat16 *scales;
    const __nv_bfloat16 *biases;
    int bits;      /* 4, 8 or 16 */
    int rows;      /* per expert */
    int cols;
    int n_experts; /* 1 for a plain matrix */
    int64_t row_bytes;
};

/* Launch-time constants of one GEMV input transform (see gemv_decode.cu). */
enum gemv_input_mode {
    GEMV_IN_PLAIN = 0,   /* x = act */
    GEMV_IN_RMSNORM = 1, /* x = act * rsqrt(mean(act^2) + eps) * norm_w   (over all cols) */
    GEMV_IN_GATED = 2,   /* x = (act * rsqrt(mean_head(act^2) + eps)) * norm_w[d] * silu(z)  per head of head_dim */
};
enum gemv_output_mode {
    GEMV_OUT_STORE = 0,  /* y[row] = dot */
    GEMV_OUT_ADD = 1,    /* y[row] += dot (residual add; each row owned by one lane group) */
    GEMV_OUT_ARGMAX = 2, /* y[row] = dot, and atomicMax of (value, -row) into *argmax */
};

#define GEMV_MAX_MATS 4

/* The decode GEMV kernels (gemv_kernel_choose picks one per batch shape). */
enum gemv_kernel_id {
    GEMV_KERNEL_AUTO = 0,   /* gemv_batch.kernel: gemv_kernel_choose decides */
    GEMV_KERNEL_SIMT = 1,   /* gemv_decode.cu: fp32 FMA, any n_tokens, every storage width */
    GEMV_KERNEL_MMA = 2,    /* gemv_mma.cu: 4-bit, one token, tensor cores */
    GEMV_KERNEL_STREAM = 3, /* gemv_stream.cu: as MMA with the weights streamed by sm_90 bulk copies */
};

/* Up to 4 matrices with the same cols and bits that read the same input, outputs concatenated. */
struct gemv_batch {
    dmat m[GEMV_MAX_MATS];
    float *y[GEMV_MAX_MATS]; /* [n_tokens][y_stride] */
    int y_stride[GEMV_MAX_MATS];
    int row_start[GEMV_MAX_MATS + 1]; /* prefix of rows */
    int n_mats;
    int grid_cap; /* most blocks per token (0: 264 = 2 per SM of an H100/H200) */
    int exact;    /* 1 (exact mode): the fp32 SIMT kernel only, never gemv_mma / gemv_stream (fp16 operands) */
    int kernel;   /* gemv_kernel_id: GEMV_KERNEL_AUTO, or a kernel the batch's shape supports (tests) */
};

struct gemv_input {
    const float *act;   /* [n_tokens][act_stride] */
    int act_stride;
    int mode;           /* gemv_input_mode */
    const float *norm_w;/* RMSNORM: [cols]; GATED: [head_dim] */
    const float *z;     /* GATED: [n_tokens][z_stride] */
    int z_stride;
    int head_dim;       /* GATED */
    float eps;
};

/* ---- error checking ---------------------------------------------------------------------------- */

/* Evaluate a CUDA runtime call; on failure record "call: error name (text)" in the backend's error
 * and return LILY_ERR_BACKEND (or LILY_ERR_OUT_OF_MEMORY for cudaErrorMemoryAllocation). Used inside
 * functions that have `lily_error *err` in scope. */
#define CUDA_TRY(call)                                                                             \
    do {                                                                                           \
        cudaError_t e_ = (call);                                                                   \
        if (e_ != cudaSuccess)                                                                     \
            return lily_cuda_error(err, e_, #call, __FILE__, __LINE__);                            \
    } while (0)

/* ---- device helpers ----------------------------------------------------------------------------- */

__device__ __forceinline__ float warp_sum(float v)
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float warp_max(float v)
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

__device__ __forceinline__ float silu_f(float x) { return x / (1.0f + expf(-x)); }
__device__ __forceinline__ float sigmoid_f(float x) { return 1.0f / (1.0f + expf(-x)); }
__device__ __forceinline__ float bf2f(__nv_bfloat16 v) { return __bfloat162float(v); }

/* Programmatic dependent launch (sm_90): kernels are launched with launch_pdl() so the next kernel's
 * blocks may start while this one drains. Every kernel calls pdl_wait() before it reads anything an
 * earlier kernel of the same forward call wrote, or writes anything (only immutable weights, and state
 * last written by an earlier forward call, may be read before it: each forward call begins with a plain
 * launch, embed), and pdl_trigger() so its own dependent may start — in decode kernels at the very
 * start, so the next kernel's weight prefetch overlaps this one. Both are no-ops when launched without
 * the attribute. */
__device__ __forceinline__ void pdl_wait(void)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_trigger(void)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" :::);
#endif
}

/* cuda_arch.cu: whether the running GPU code was compiled for sm_90 (false on the compute_80 PTX path). */
bool cuda_sm90_code(void);
/* Whether the current device is compute capability 9.0 and runs the sm_90a image of the kernels: the
 * caller reads its own __device__ int that is 1 only in that image (cudaMemcpyFromSymbol must run in the
 * file that defines the symbol: wgmma kernels, gemm_prefill_wgmma.cu, attention_prefill_wg.cu) and passes
 * the read's status and the value. Queries that fail answer false and leave no sticky error. */
bool cuda_sm90a_image(cudaError_t read, int flag);

/* Launch kernel k<<<grid, block, smem, s>>>(args...) with programmatic stream serialization. */
template <typename... KArgs, typename... Args>
static inline cudaError_t launch_pdl(void (*k)(KArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t s,
                                     Args... args)
{
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = s;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = attr;
    /* programmatic launch needs the sm_90 code (pdl_wait is compiled out of the compute_80 PTX, which
     * every GPU other than compute capability 9.0 runs): plain launches there */
    cfg.numAttrs = cuda_sm90_code() ? 1 : 0;
    cudaError_t e = cudaLaunchKernelEx(&cfg, k, ((KArgs)args)...);
    return e != cudaSuccess ? e : cudaGetLastError();
}

/* The number of SMs of the current device in *sms. */
static inline cudaError_t cuda_sm_count(int *sms)
{
    int dev = 0;
    cudaError_t e = cudaGetDevice(&dev);
    if (e == cudaSuccess)
        e = cudaDeviceGetAttribute(sms, cudaDevAttrMultiProcessorCount, dev);
    return e;
}

/* How many blocks of kernel k (threads per block, smem dynamic bytes) fit on the current GPU at once:
 * SMs · max(1, blocks per SM). Asked only while *resident is 0: the caller keeps *resident in a static
 * of its own, one per kernel instance, so each instance asks once. On an error *resident stays 0. */
template <typename K>
static inline cudaError_t cuda_resident_blocks(K k, int threads, size_t smem, int *resident)
{
    if (*resident)
        return cudaSuccess;
    int sms = 0, per_sm = 0;
    cudaError_t e = cuda_sm_count(&sms);
    if (e == cudaSuccess)
        e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, k, threads, smem);
    if (e != cudaSuccess)
        return e;
    *resident = sms * (per_sm > 0 ? per_sm : 1);
    return cudaSuccess;
}

/* Opt kernel k in to smem bytes of dynamic shared memory when that is above *smem_set, the amount it is
 * already allowed (the caller's static, one per kernel instance, starting at the 48 KiB default). */
template <typename K>
static inline cudaError_t cuda_smem_opt_in(K k, size_t smem, size_t *smem_set)
{
    if (smem <= *smem_set)
        return cudaSuccess;
    const cudaError_t e = cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (e != cudaSuccess)
        return e;
    *smem_set = smem;
    return cudaSuccess;
}

/* Order-preserving key of (value, row) for atomicMax: larger value wins, then the lower row. */
__device__ __forceinline__ unsigned long long argmax_key(float v, int row)
{
    unsigned int u = __float_as_uint(v);
    u = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
    return ((unsigned long long)u << 32) | (unsigned long long)(0xffffffffu - (unsigned int)row);
}
__device__ __forceinline__ int argmax_key_row(unsigned long long k)
{
    return (int)(0xffffffffu - (unsigned int)(k & 0xffffffffu));
}

/* ---- launch wrappers (one group per .cu file) ---------------------------------------------------- */

/* gemv_decode.cu: y = W x for n_tokens rows of x, every matrix of the batch, by b.kernel (AUTO:
 * gemv_kernel_choose). argmax may be NULL unless out_mode == GEMV_OUT_ARGMAX. Returns
 * cudaErrorInvalidValue for a shape it has no kernel for. */
cudaError_t launch_gemv(const gemv_batch &b, const gemv_input &in, int out_mode, int n_tokens,
                        unsigned long long *argmax, cudaStream_t s);
/* Whether gemv_decode.cu has a lane shape for rows of `cols` columns at `bits` (4, 8, 16): cols a
 * multiple of 128 / bits whose vector count is 4..128 (a power of two), 3 x 4..32, or 256 / 512 (bf16). */
bool gemv_cols_supported(int bits, int cols);
/* The one place a decode GEMV kernel is chosen: STREAM where gemv_stream_supported, else MMA where
 * gemv_mma_supported, else SIMT. */
gemv_kernel_id gemv_kernel_choose(const gemv_batch &b, int n_tokens);
/* gemv_mma.cu: the 4-bit decode (one token) GEMV on tensor cores (4-bit, n_tokens 1, cols % 128, cols /
 * min(cols, 512) in 1, 2, 4, 8, 16-byte aligned data, not exact). */
cudaError_t launch_gemv_mma(const gemv_batch &b, const gemv_input &in, int out_mode, unsigned long long *argmax,
                            cudaStream_t s);
bool gemv_mma_supported(const gemv_batch &b, int n_tokens);
/* gemv_stream.cu: the same GEMV with the weights streamed through a shared-memory ring (sm_90 bulk
 * copies): gemv_mma_supported, cols 512 / 1024 / 2048 / 4096, plain matrices, >= 1 KiB of weights, the
 * sm_90 code running. */
cudaError_t launch_gemv_stream(const gemv_batch &b, const gemv_input &in, int out_mode, unsigned long long *argmax,
                               cudaStream_t s);
bool gemv_stream_supported(const gemv_batch &b, int n_tokens);

/* moe_route.cu */
struct moe_args {
    dmat gate, up, down;            /* routed experts */
    dmat sgate, sup, sdown;         /* shared expert */
    const float *router_logits;     /* [n_tokens][logit_stride]: n_experts logits, then the shared-gate logit */
    int logit_stride;
    int n_experts, top_k, inter, shared_inter, hidden;
    const float *h;                 /* residual stream [n_tokens][hidden] (input of the post-attention norm) */
    const float *norm_w;            /* post_attention_layernorm (1 + w form) [hidden] */
    float eps;
    float *hid;                     /* scratch [n_tokens][top_k + 1][max(inter, shared_inter)] */
    int *topk_idx;                  /* scratch [n_tokens][top_k] */
    float *topk_w;                  /* scratch [n_tokens][top_k] */
    float *out;                     /* residual stream to add into: [n_tokens][hidden] (may equal h) */
    int exact;                      /* 1 (exact mode): moe_route.cu's fp32 kernels only, never moe_decode.cu's */
    /* Decode, early ids (moe_decode.cu): the session's forward-call counter (device; not
     * written during a forward call), its MOE_PUB_WORDS tagged top-k words (cuda_counters) and the layer
     * index (< 256). topk_pub NULL: off. */
    const int *step;
    unsigned long long *topk_pub;
    int layer;
};
/* Tagged top-k words of moe_args.topk_pub: 2 per slot (id, weight), MOE_MAX_K (moe_topk.cuh) slots. */
#define MOE_PUB_WORDS 32
cudaError_t launch_moe_gate_up(const moe_args &a, int n_tokens, cudaStream_t s);
cudaError_t launch_moe_down(const moe_args &a, int n_tokens, cudaStream_t s);
/* Whether moe_route.cu's kernels take these shapes (any n_tokens): gate/up `gu_bits` with hidden
 * columns, down `down_bits` with inter (routed) and shared_inter (shared expert) columns, top_k of
 * n_experts. The routed and shared experts must share the storage width of each stage. */
bool moe_route_supported(int gu_bits, int down_bits, int hidden, int inter, int shared_inter, int n_experts, int top_k);
/* moe_decode.cu: the same two stages for one decode token on tensor cores (launch_moe_* call them). */
bool moe_decode_mma_supported(const moe_args &a, int n_tokens);
cudaError_t launch_moe_gate_up_mma(const moe_args &a, cudaStream_t s);
cudaError_t launch_moe_down_mma(const moe_args &a, cudaStream_t s);
/* Whether the MoE kernels of layer `layer` use the tagged top-k (PDL on sm_90 code, layer < 256). */
bool moe_early_ids_wanted(int layer);

/* DeltaNet calls of at least this many tokens take the chunked delta rule (deltanet_chunked.cu), shorter
 * ones the sequential recurrence (docs/BENCHMARKS.md, "DeltaNet prefill"). */
#define GDN_CHUNKED_MIN_TOKENS 256

/* The Gated DeltaNet mixer kernels (gdn_kernel_choose picks one per call). */
enum gdn_kernel {
    GDN_KERNEL_AUTO = 0,       /* gdn_args.kernel: gdn_kernel_choose decides */
    GDN_KERNEL_SCAN = 1,       /* deltanet_scan.cu: conv + norms + delta rule, any n (fp32) */
    GDN_KERNEL_DECODE = 2,     /* deltanet_scan.cu: one token, barrier-free */
    GDN_KERNEL_RECURRENCE = 3, /* deltanet_prefill.cu: prep for all tokens, then the sequential delta rule */
    GDN_KERNEL_CHUNKED = 4,    /* deltanet_chunked.cu: prep, then the chunked (WY) delta rule on tensor cores */
};

/* deltanet_scan.cu */
struct gdn_args {
    const float *mixed;   /* [n][mixed_stride] in_proj_qkv output (pre-conv), conv_dim channels */
    int mixed_stride;
    const float *ba;      /* [n][ba_stride]: b at [0,Hv), a at [Hv, 2Hv) */
    int ba_stride;
    const float *conv_w;  /* [conv_dim][K] */
    const float *A_log, *dt_bias; /* [Hv] */
    float *conv_state;    /* [2][K-1][conv_dim]: ping-pong by *step & 1 */
    float *state;         /* [Hv][dk][dv] fp32 */
    const int *step;      /* forward-call counter (device) */
    float *out;           /* [n][Hv*dv] raw delta-rule output (gated norm applied by out_proj's GEMV) */
    int Hk, Hv, dk, dv, K, conv_dim;
    int kernel;           /* gdn_kernel: GDN_KERNEL_AUTO, or one the shape supports (tests) */
};
/* The one place a DeltaNet kernel is chosen: n_tokens 1: DECODE (dv % 32 == 0) else SCAN; longer calls:
 * CHUNKED from GDN_CHUNKED_MIN_TOKENS tokens (not in exact mode: 3xTF32 products), else RECURRENCE, else
 * SCAN, each where its *_supported says yes. */
gdn_kernel gdn_kernel_choose(const gdn_args &a, int n_tokens, bool exact);
/* The mixer for n_tokens by a.kernel (AUTO: gdn_kernel_choose(a, n, false)); pre and wy are the scratch of
 * launch_gdn_prefill / launch_gdn_prefill_chunked (RECURRENCE needs pre, CHUNKED both; without them the
 * call falls back to SCAN). */
cudaError_t launch_gdn(const gdn_args &a, float *pre, float *wy, int n_tokens, cudaStream_t s);
/* The general scan (SCAN), or DECODE for n_tokens == 1 when a.kernel is not SCAN and dv % 32 == 0. */
cudaError_t launch_gdn_scan(const gdn_args &a, int n_tokens, cudaStream_t s);
/* deltanet_prefill.cu: the same mixer for a chunk:
 * gdn_prep_kernel (conv, norms, gates for all tokens at once) into pre [n_tokens][gdn_prefill_stride]
 * floats (scratch sized for max_chunk), then gdn_recur_kernel (the delta rule only). Same state and conv
 * state semantics as launch_gdn_scan. cudaErrorInvalidValue for a shape gdn_prefill_supported rejects. */
int gdn_prefill_stride(int conv_dim, int Hv);
bool gdn_prefill_supported(const gdn_args &a); /* dk 32/64/128, Hv % Hk == 0, K <= 4, dv % 32 */
cudaError_t launch_gdn_prefill(const gdn_args &a, float *pre, int n_tokens, cudaStream_t s);
/* gdn_prep_kernel alone (the first half of launch_gdn_prefill; launch_gdn_prefill_chunked's too). */
cudaError_t launch_gdn_prep(const gdn_args &a, float *pre, int n_tokens, cudaStream_t s);
/* deltanet_chunked.cu: the same mixer with the delta rule in its chunked (WY) form on tensor cores:
 * gdn_prep_kernel, then per (64-token chunk, value head) the intra-chunk matrices into wy
 * (>= gdn_chunked_scratch_floats(n_tokens, Hv, dk, dv) floats), then the inter-chunk recurrence. Same
 * outputs, state and conv state as launch_gdn_prefill (fp32-level accuracy: 3xTF32 products).
 * cudaErrorInvalidValue for a shape gdn_chunked_supported rejects. */
bool gdn_chunked_supported(const gdn_args &a); /* gdn_prefill_supported, dk 32/64/128, dv <= 128 */
int gdn_chunked_record_floats(int dk, int dv);
size_t gdn_chunked_scratch_floats(int max_tokens, int Hv, int dk, int dv);
cudaError_t launch_gdn_prefill_chunked(const gdn_args &a, float *pre, float *wy, int n_tokens, cudaStream_t s);

/* attention.cu (norm_rope.cu + attention_decode.cu) */
struct attn_args {
    float *qkv;            /* [n][qkv_stride]: q_proj (heads x [q, gate]) | k | v */
    int qkv_stride;
    const float *q_norm, *k_norm; /* [head_dim] */
    float eps;
    float *q;              /* [n][n_heads][head_dim] normed + rotated query (unused when q_fused) */
    __nv_bfloat16 *k_cache, *v_cache; /* [n_kv][max_ctx][head_dim] bf16; NULL in exact mode */
    float *k_cache_f32, *v_cache_f32; /* exact mode: the same layout in fp32 (else NULL); written by norm_rope.cu,
                                       * read only by the SIMT attention kernel (launch_attention): the
                                       * tensor-core kernels' *_supported() reject it */
    int max_ctx;
    const int *pos;        /* position of token 0 (device) */
    int n_heads, n_kv, head_dim, rot_dim;
    float rope_theta;
    float *out;            /* [n][n_heads*head_dim] gated attention output */
    /* split-KV (decode only) */
    int n_splits, min_chunk;
    float *part_o;         /* [n_kv][n_splits][G][head_dim] */
    float *part_ml;        /* [n_kv][n_splits][G][2] */
    unsigned int *counter; /* [n_kv], zero between launches */
    /* prefill only: 1 = the flash kernel (launch_attention_prefill) norms and rotates q from qkv itself
     * (q unused; launch_qk_norm_rope_append then does k/v only); 0 = q from a.q */
    int q_fused;
    int prefill_kernel;    /* attn_prefill_kernel (the backend's attn_prefill_kernel_choose) */
    int decode_kernel;     /* attn_decode_kernel: ATTN_DECODE_AUTO, or one the shape supports (tests) */
};
/* The prefill flash-attention kernel family, chosen once per backend. */
enum attn_prefill_kernel {
    ATTN_PREFILL_MMA = 0,   /* attention_prefill.cu: mma.sync, sm_80+ */
    ATTN_PREFILL_WGMMA = 1, /* attention_prefill_wg.cu: Hopper wgmma, softmax overlapping the previous P·V */
};
/* ATTN_PREFILL_WGMMA when the device runs the binary's sm_90a image, else ATTN_PREFILL_MMA. Call outside
 * stream capture. */
attn_prefill_kernel attn_prefill_kernel_choose(void);
/* The decode attention kernels (attn_decode_kernel_choose picks one per call shape). */
enum attn_decode_kernel {
    ATTN_DECODE_AUTO = 0,
    ATTN_DECODE_MMA = 1,  /* attention_decode.cu: tensor cores, one token, bf16 cache */
    ATTN_DECODE_SIMT = 2, /* attention_decode.cu: fp32 SIMT, any n, bf16 or fp32 cache */
};
/* MMA where attention_decode_mma_supported, else SIMT. */
attn_decode_kernel attn_decode_kernel_choose(const attn_args &a, int n_tokens);
/* norm_rope.cu: q/k RMSNorm + partial RoPE, k and v appended to the cache (bf16, or fp32 when
 * a.k_cache_f32) at *pos .. *pos + n_tokens - 1, q written to a.q; with a.q_fused only k and v (a.q
 * untouched). cudaErrorInvalidValue when more than 32 heads (q + k + v warps), head_dim > 256 or
 * rot_dim > head_dim. */
cudaError_t launch_qk_norm_rope_append(const attn_args &a, int n_tokens, cudaStream_t s);
/* Decode attention by a.decode_kernel (AUTO: attn_decode_kernel_choose): n_tokens == 1 on tensor cores
 * where attention_decode_mma_supported() (G <= 8, head_dim 64/128/256, n_splits <= 256, a bf16 cache; split-KV
 * merged by a second kernel, counter unused), else the SIMT kernel (G 1, 2, 3, 4 or 8, head_dim 64/128/256,
 * n_splits <= head_dim, last-block merge; a bf16 or an fp32 cache). */
cudaError_t launch_attention(const attn_args &a, int n_tokens, cudaStream_t s); /* a.q_fused must be 0 */
bool attention_decode_mma_supported(const attn_args &a, int n_tokens);

/* attention_prefill.cu: causal flash attention (tensor cores) for a chunk of n_tokens >= 1 queries at
 * positions *pos .. *pos + n_tokens - 1 over cache keys [0, *pos + n_tokens), same inputs (q, k/v cache
 * already appended, gate in qkv) and output (out) as launch_attention. With a.q_fused the kernel reads
 * the raw q (first half of each q_proj head row in qkv) and applies the q RMSNorm (q_norm, eps) and the
 * partial RoPE (rot_dim, rope_theta, positions) of norm_rope.cu while staging it; a.q is not read.
 * a.n_splits > 1 splits the keys of each query tile across blocks and merges (uses part_o >= n_splits
 * * n_tokens * n_heads * head_dim floats, part_ml >= n_splits * n_tokens * n_heads * 2).
 * cudaErrorInvalidValue for an unsupported shape. */
/* head_dim 64, 128 or 256; n_heads % n_kv == 0; a bf16 cache (never exact mode's fp32 one); with q_fused also
 * q_norm set, rot_dim even, <= head_dim */
bool attention_prefill_supported(const attn_args &a);
cudaError_t launch_attention_prefill(const attn_args &a, int n_tokens, cudaStream_t s);
/* Split count for a chunk of n_tokens at context position ctx (host hint): about two blocks per SM,
 * at least 8 key tiles per split, n_splits * n_tokens <= cap_splits (the partial buffers' capacity). */
int attention_prefill_splits(const attn_args &a, int n_tokens, int ctx, int cap_splits);

/* embed.cu */
cudaError_t launch_embed(const dmat &e, const int *tokens, int n, float *h, int hidden, int *bad_token,
                         cudaStream_t s);

/* sample.cu */
struct sample_args {
    unsigned long long *argmax; /* greedy: packed (value,row) from the LM-head GEMV, reset here */
    const float *logits;        /* [vocab] */
    int vocab;
    int *token_slots;           /* [2] next-step input slots */
    int *out_tokens;            /* [cap] generated ids */
    int out_cap;
    int *step;                  /* forward-call counter, advanced here */
    int *pos;                   /* position, advanced by n here */
    int *n_generated;
    int *host_tokens;           /* mapped host memory [out_cap + 1] (tokens, then the count), or NULL */
};
/* Greedy: token = argmax; writes slot[(step+1)&1], out_tokens[n_generated++]; advances pos/step. */
cudaError_t launch_finish_greedy(const sample_args &a, cudaStream_t s);
/* Advance pos by n and step by 1 (used by forward()). */
cudaError_t launch_advance(int *pos, int *step, int n, cudaStream_t s);
/* Top-k / top-p / temperature sampling of logits into the same slots (k <= 64; top_k <= 0 means 64). */
cudaError_t launch_sample_topk_topp(const sample_args &a, float temperature, int top_k, float top_p,
                                    unsigned long long seed, float *scratch, cudaStream_t s);
/* *p = v (a kernel, so the host never waits on a pageable copy). */
cudaError_t launch_set_int(int *p, int v, cudaStream_t s);
/* Fill n bf16 values with a deterministic pseudo-random pattern in [-1, 1] (bench: a KV cache at depth). */
cudaError_t launch_fill_random_bf16(__nv_bfloat16 *p, size_t n, unsigned int seed, cudaStream_t s);
/* The same values (as bf16 rounds them) stored fp32, for an exact-mode KV cache. */
cudaError_t launch_fill_random_f32(float *p, size_t n, unsigned int seed, cudaStream_t s);
/* Reads the current input token from slot[step & 1] into tokens[0] (decode graph's first node). */
cudaError_t launch_fetch_token(const int *token_slots, const int *step, int *tokens, cudaStream_t s);

#endif
