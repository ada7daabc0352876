/* attention.cuh — the gated full-attention mixer after the q/k/v projection: q/k RMSNorm + partial RoPE and
 * the KV-cache append (norm_rope.cu; in decode done by the tensor-core kernel itself,
 * attention_decode_q.cuh), decode attention (attention_decode.cu: SIMT and tensor cores) and
 * prefill flash attention (attention_prefill.cu: mma.sync; attention_prefill_wg.cu: Hopper wgmma).
 */
#ifndef LILY_CUDA_ATTENTION_CUH
#define LILY_CUDA_ATTENTION_CUH

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/timeline.cuh"

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
    /* 1: the flash kernel (launch_attention_prefill) norms and rotates q from qkv itself, so
     * launch_qk_norm_rope_append does k/v only and q is unused; 0: norm_rope.cu writes q (launch_attention).
     * The fused decode kernel (ATTN_DECODE_MMA_FUSED) ignores it: no norm_rope.cu launch precedes it. */
    int q_fused;
    int prefill_kernel;    /* attn_prefill_kernel (the backend's attn_prefill_kernel_choose) */
    int decode_kernel;     /* attn_decode_kernel: ATTN_DECODE_AUTO, or one the shape supports (tests) */
    unsigned long long *timeline; /* per-block stamps (timeline.cuh; decode: the merge kernel's in the next
                                   * slot); NULL: none */
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
    ATTN_DECODE_MMA = 1,  /* attention_decode.cu: tensor cores, one token, bf16 cache; after norm_rope.cu */
    ATTN_DECODE_SIMT = 2, /* attention_decode.cu: fp32 SIMT, any n, bf16 or fp32 cache; after norm_rope.cu */
    ATTN_DECODE_MMA_FUSED = 3, /* the MMA kernel doing norm_rope.cu's work itself (q norm + RoPE from qkv, the
                                * new k / v row computed and appended): no launch_qk_norm_rope_append before it */
};
/* MMA_FUSED where attention_decode_fused_supported, else MMA where attention_decode_mma_supported, else SIMT.
 * The caller launches launch_qk_norm_rope_append before launch_attention unless it returns MMA_FUSED. */
attn_decode_kernel attn_decode_kernel_choose(const attn_args &a, int n_tokens);
/* norm_rope.cu: q/k RMSNorm + partial RoPE, k and v appended to the cache (bf16, or fp32 when
 * a.k_cache_f32) at *pos .. *pos + n_tokens - 1, q written to a.q; with a.q_fused only k and v (a.q
 * untouched). cudaErrorInvalidValue when more than 32 heads (q + k + v warps), head_dim > 256 or
 * rot_dim > head_dim. */
cudaError_t launch_qk_norm_rope_append(const attn_args &a, int n_tokens, cudaStream_t s);
/* Decode attention by a.decode_kernel (AUTO: attn_decode_kernel_choose): n_tokens == 1 on tensor cores
 * where attention_decode_mma_supported() (G <= 8, head_dim 64/128/256, n_splits <= 256, a bf16 cache; split-KV
 * merged by a second kernel, counter unused), else the SIMT kernel (G 1, 2, 3, 4 or 8, head_dim 64/128/256,
 * n_splits <= head_dim, last-block merge; a bf16 or an fp32 cache).
 * With a.decode_kernel (or AUTO's choice) ATTN_DECODE_MMA_FUSED: the cache row *pos is written here, q is
 * read raw from qkv (a.q untouched; cudaErrorInvalidValue where !attention_decode_fused_supported; a GPU
 * without the shared memory runs norm_rope.cu + the SIMT kernel instead). Otherwise a.q_fused must be 0. */
cudaError_t launch_attention(const attn_args &a, int n_tokens, cudaStream_t s);
bool attention_decode_mma_supported(const attn_args &a, int n_tokens);
/* attention_decode_mma_supported, q_norm and k_norm set, rot_dim even and <= head_dim */
bool attention_decode_fused_supported(const attn_args &a, int n_tokens);

/* attention_prefill.cu: causal flash attention (tensor cores) for a chunk of n_tokens >= 1 queries at
 * positions *pos .. *pos + n_tokens - 1 over cache keys [0, *pos + n_tokens), same inputs (q, k/v cache
 * already appended, gate in qkv) and output (out) as launch_attention. The kernel reads the raw q (first
 * half of each q_proj head row in qkv) and applies the q RMSNorm (q_norm, eps) and the partial RoPE
 * (rot_dim, rope_theta, positions) of norm_rope.cu while staging it; a.q is not read (set a.q_fused so
 * launch_qk_norm_rope_append leaves it alone).
 * a.n_splits > 1 splits the keys of each query tile across blocks and merges (uses part_o >= n_splits
 * * n_tokens * n_heads * head_dim floats, part_ml >= n_splits * n_tokens * n_heads * 2).
 * cudaErrorInvalidValue for an unsupported shape. */
/* head_dim 64, 128 or 256; n_heads % n_kv == 0; a bf16 cache (never exact mode's fp32 one); q_norm set,
 * rot_dim even, <= head_dim */
bool attention_prefill_supported(const attn_args &a);
cudaError_t launch_attention_prefill(const attn_args &a, int n_tokens, cudaStream_t s);
/* Split count for a chunk of n_tokens at context position ctx (host hint): about two blocks per SM,
 * at least 8 key tiles per split, n_splits * n_tokens <= cap_splits (the partial buffers' capacity). */
int attention_prefill_splits(const attn_args &a, int n_tokens, int ctx, int cap_splits);

#endif
