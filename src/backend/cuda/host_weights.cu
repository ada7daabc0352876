/* host_weights.cu — weights kept in host memory that the kernels read over PCIe (--n-cpu-moe): pinned
 * host allocations mapped into the device's address space (zero-copy). A kernel's load from such a
 * pointer crosses the bus each time, so only the bytes a launch touches move: in decode, the selected
 * experts' rows; the results are the all-device ones bit for bit, since the same kernels run.
 *
 * Write-combined: the host only writes these pages, once at upload; the device's reads skip the host's
 * caches (CUDA C Programming Guide, "Write-Combining Memory"). Not so when decode runs these experts on the
 * CPU (cpu_experts.cu): the CPU's reads of write-combined pages bypass its caches and crawl.
 */
#include "cuda_internal.cuh"

lily_status cuda_host_weight_alloc(size_t bytes, bool write_combined, void **host, void **device, lily_error *err)
{
    *host = *device = NULL;
    CUDA_TRY(cudaHostAlloc(host, bytes ? bytes : 16,
                           cudaHostAllocMapped | cudaHostAllocPortable |
                               (write_combined ? cudaHostAllocWriteCombined : 0u)));
    const cudaError_t e = cudaHostGetDevicePointer(device, *host, 0);
    if (e != cudaSuccess) {
        cudaFreeHost(*host);
        *host = NULL;
        CUDA_TRY(e);
    }
    return LILY_OK;
}

bool cuda_layer_experts_on_host(const cuda_ctx *c, int layer)
{
    return layer < c->opts.n_cpu_moe;
}

/* ---- prefill: a host layer's experts staged to the device ------------------------------------------
 * A long prefill chunk routes tokens to nearly every expert and the grouped GEMM reads an expert's
 * weights once per tile of its tokens, so reading them in place would move them over the bus more than
 * once. Instead, for calls of at least CUDA_MOE_STAGE_MIN_TOKENS tokens, each host layer's experts are copied
 * once into one device buffer (cudaMemcpyAsync from the pinned pages: DMA at the link's rate) on a
 * second stream, starting when the layer begins (after the previous layer's MoE block, which used the
 * buffer, is done) so the copy overlaps the layer's attention or DeltaNet block; the MoE block waits for
 * it. Decode and short calls keep reading in place: they touch only the selected experts. */

#define STAGE_ALIGN 256

/* Bytes of a dmat's data, scales, biases (scales and biases 0 for bf16). */
static void dmat_parts(const dmat &m, size_t part[3])
{
    const size_t rows = (size_t)m.rows * (size_t)m.n_experts;
    part[0] = rows * (size_t)m.row_bytes;
    part[1] = part[2] = m.bits == 4 || m.bits == 8 ? rows * (size_t)(m.cols / 64) * 2 : 0;
}

static size_t align_up(size_t x)
{
    return (x + STAGE_ALIGN - 1) / STAGE_ALIGN * STAGE_ALIGN;
}

size_t cuda_experts_stage_bytes(size_t expert_layer_bytes)
{
    return expert_layer_bytes + 9 * STAGE_ALIGN;
}

lily_status cuda_experts_stage_init(cuda_ctx *c, lily_error *err)
{
    c->staged_layer = -1;
    if (c->opts.n_cpu_moe <= 0 || c->opts.exact || c->max_chunk < CUDA_MOE_STAGE_MIN_TOKENS ||
        c->max_chunk < c->prefill_min_tokens)
        return LILY_OK;
    size_t bytes = 0;
    const cuda_layer *L = &c->layers[0];
    const dmat *m[3] = {&L->ex_gate, &L->ex_up, &L->ex_down};
    for (int k = 0; k < 3; k++) {
        size_t part[3];
        dmat_parts(*m[k], part);
        bytes += align_up(part[0]) + align_up(part[1]) + align_up(part[2]);
    }
    CUDA_TRY(cudaMalloc(&c->stage_buf, bytes));
    c->stage_buf_bytes = bytes;
    CUDA_TRY(cudaStreamCreateWithFlags(&c->stage_stream, cudaStreamNonBlocking));
    CUDA_TRY(cudaEventCreateWithFlags(&c->stage_free, cudaEventDisableTiming));
    CUDA_TRY(cudaEventCreateWithFlags(&c->stage_done, cudaEventDisableTiming));
    return LILY_OK;
}

void cuda_experts_stage_free(cuda_ctx *c)
{
    if (c->stage_done)
        cudaEventDestroy(c->stage_done);
    if (c->stage_free)
        cudaEventDestroy(c->stage_free);
    if (c->stage_stream) {
        cudaStreamSynchronize(c->stage_stream); /* a copy a failed forward left queued */
        cudaStreamDestroy(c->stage_stream);
    }
    if (c->stage_buf)
        cudaFree(c->stage_buf);
}

lily_status cuda_experts_stage(cuda_ctx *c, int layer, int n, lily_error *err)
{
    c->staged_layer = -1;
    if (!c->stage_buf || n < CUDA_MOE_STAGE_MIN_TOKENS || !cuda_layer_experts_on_host(c, layer))
        return LILY_OK;
    const cuda_layer *L = &c->layers[layer];
    const dmat *src[3] = {&L->ex_gate, &L->ex_up, &L->ex_down};
    dmat *dst[3] = {&c->staged_gate, &c->staged_up, &c->staged_down};
    CUDA_TRY(cudaEventRecord(c->stage_free, c->stream)); /* the previous layer's MoE block is queued before */
    CUDA_TRY(cudaStreamWaitEvent(c->stage_stream, c->stage_free, 0));
    uint8_t *p = (uint8_t *)c->stage_buf;
    for (int k = 0; k < 3; k++) {
        size_t part[3];
        dmat_parts(*src[k], part);
        *dst[k] = *src[k];
        const void *from[3] = {src[k]->data, src[k]->scales, src[k]->biases};
        void *to[3];
        for (int j = 0; j < 3; j++) {
            to[j] = part[j] ? p : NULL;
            if (part[j])
                CUDA_TRY(cudaMemcpyAsync(p, from[j], part[j], cudaMemcpyDefault, c->stage_stream));
            p += align_up(part[j]);
        }
        dst[k]->data = (const uint8_t *)to[0];
        dst[k]->scales = (const __nv_bfloat16 *)to[1];
        dst[k]->biases = (const __nv_bfloat16 *)to[2];
    }
    CUDA_TRY(cudaEventRecord(c->stage_done, c->stage_stream));
    c->staged_layer = layer;
    return LILY_OK;
}

lily_status cuda_layer_experts(cuda_ctx *c, const cuda_layer *L, dmat *gate, dmat *up, dmat *down, lily_error *err)
{
    if (c->staged_layer < 0 || !c->layers || L != &c->layers[c->staged_layer]) {
        *gate = L->ex_gate;
        *up = L->ex_up;
        *down = L->ex_down;
        return LILY_OK;
    }
    CUDA_TRY(cudaStreamWaitEvent(c->stream, c->stage_done, 0));
    *gate = c->staged_gate;
    *up = c->staged_up;
    *down = c->staged_down;
    return LILY_OK;
}
