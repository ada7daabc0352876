/* deltanet_decode.cu — the Gated DeltaNet mixer of one decode token (docs/MODEL.md §4.4 steps 2-7), and the
 * op's kernel choice: causal depthwise conv (K taps) + SiLU, q/k L2 norms (eps 1e-6 inside the root, q
 * scaled by dk^-1/2), β = sigmoid(b), g = -exp(A_log)·softplus(a + dt_bias), and the delta rule in its
 * recurrent form
 *   S <- exp(g) S;  δ = β (v - Sᵀk);  S <- S + k δᵀ;  o = Sᵀq   (= (exp(g)S)ᵀq + δ (k·q))
 * with the fp32 state [Hv][dk][dv] in global memory. Chunks of n > 1 tokens run deltanet_prefill.cu or
 * deltanet_chunked.cu. The gated RMSNorm (z, norm.weight) is fused into out_proj's GEMV input
 * (gemv/gemv_decode.cu). Conv state: ping-pong buffers by the forward-call counter, so blocks that read
 * channel c never race the one block that writes it.
 */
#include "deltanet.cuh"
#include "gdn_decode_warp.cuh"

/* ---- one token (decode) ------------------------------------------------------------------------------
 *
 * Block (value head j, slice of GDN1_COLS = 16 columns), 4 warps; warp w owns 4 columns (one float4 of
 * every state row) over all dk rows, lane l the rows l*RPL .. l*RPL + RPL - 1 (RPL = dk / 32). Every
 * reduction over rows (q/k norms, k·q, Sᵀk, Sᵀq) is a warp shuffle, so the kernel has no block barrier;
 * each lane computes the conv + SiLU of the q/k channels of its own rows and of the warp's 4 v channels
 * itself (a few redundant FMAs instead of a shared-memory phase). Everything not produced by the kernel
 * just before (state, conv weights, conv history, A_log, dt_bias) is loaded before the PDL wait; after it
 * one batch of loads (this token's mixed channels, b, a), then shuffles only. grid = Hv * dv / 16. The
 * warp's work is gdn_decode_warp (gdn_decode_warp.cuh), shared with the out_proj-fused decode kernel. */

#define GDN1_WARPS 4
#define GDN1_COLS (GDN1_WARPS * GDN1_CPW)

template <int DK>
__global__ void __launch_bounds__(GDN1_WARPS * 32) gdn_decode_kernel(gdn_args a)
{
    tl_block<> tl(a.timeline);
    const int slices = a.dv / GDN1_COLS;
    const int j = blockIdx.x / slices, sl = blockIdx.x % slices;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int c0 = sl * GDN1_COLS + warp * GDN1_CPW; /* this warp's first column */
    gdn_decode_warp<DK> w;
    pdl_trigger();          /* out_proj may launch and prefetch its weights (before load(), which waits on its loads) */
    w.load(a, j, c0, lane); /* state, conv taps and history, gate parameters: before the wait */
    pdl_wait();             /* mixed and b/a come from the projection kernel just before */
    tl.waited();
    const float o = w.run(a, j, c0, lane);
    if (lane < GDN1_CPW)
        a.out[(size_t)j * a.dv + c0 + lane] = o;
}

cudaError_t launch_gdn_decode(const gdn_args &a, cudaStream_t s)
{
    if (a.dv % GDN1_COLS || a.Hv % a.Hk || a.K < 1 || a.K > 4)
        return cudaErrorInvalidValue;
    const dim3 grid(a.Hv * (a.dv / GDN1_COLS));
    switch (a.dk) {
    case 32: return launch_pdl(gdn_decode_kernel<32>, grid, dim3(GDN1_WARPS * 32), 0, s, a);
    case 64: return launch_pdl(gdn_decode_kernel<64>, grid, dim3(GDN1_WARPS * 32), 0, s, a);
    case 128: return launch_pdl(gdn_decode_kernel<128>, grid, dim3(GDN1_WARPS * 32), 0, s, a);
    default: return cudaErrorInvalidValue;
    }
}

gdn_kernel gdn_kernel_choose(const gdn_args &a, int n_tokens, bool exact)
{
    if (n_tokens == 1)
        return !exact && a.fuse_out && gdn_out_fused_supported(a) ? GDN_KERNEL_DECODE_FUSED : GDN_KERNEL_DECODE;
    if (!exact && n_tokens >= GDN_CHUNKED_MIN_TOKENS && gdn_chunked_supported(a))
        return GDN_KERNEL_CHUNKED;
    return GDN_KERNEL_RECURRENCE;
}

cudaError_t launch_gdn(const gdn_args &a, float *pre, float *wy, int n_tokens, cudaStream_t s)
{
    const int k = a.kernel != GDN_KERNEL_AUTO ? a.kernel : gdn_kernel_choose(a, n_tokens, false);
    if (n_tokens == 1 && k == GDN_KERNEL_DECODE)
        return launch_gdn_decode(a, s);
    if (k == GDN_KERNEL_DECODE_FUSED)
        return n_tokens == 1 ? launch_gdn_out_fused(a, s) : cudaErrorInvalidValue;
    if (k == GDN_KERNEL_CHUNKED && pre && wy)
        return launch_gdn_prefill_chunked(a, pre, wy, n_tokens, s);
    if (!pre)
        return cudaErrorInvalidValue;
    return launch_gdn_prefill(a, pre, n_tokens, s); /* RECURRENCE; CHUNKED without its scratch */
}
