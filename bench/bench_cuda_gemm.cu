/* bench_cuda_gemm.cu — the prefill GEMMs of Qwen3.6-35B-A3B (MLX 4-bit) for one chunk of n tokens, by kernel
 * family and tile (launch_gemm with gemm_args.kernel / tile_tokens set per launch: nothing global), so the
 * families can be compared on one GPU in one build: GEMM_KERNEL_MMA (integer weights + per-group fold),
 * GEMM_KERNEL_MMA_DQ (mma.sync on fp16-dequantized weights: what GPUs without the sm_90a image run) and,
 * where the sm_90a kernel runs, GEMM_KERNEL_WGMMA.
 *
 * Shapes (hidden 2048, 256 experts of 512, top-8; docs/BENCHMARKS.md names them): the DeltaNet in_proj
 * (qkv 8192 | z 4096 | b 32 | a 32 rows, one launch) and out_proj (2048 x 4096, +=), the attention q|k|v
 * (8192 | 512 | 512) and o_proj, the routed experts' gate/up (grouped SwiGLU over a random top-8 routing,
 * rows gathered) and down (grouped), the shared expert's gate/up and down. Weights, activations and the
 * routing are random (timing does not depend on the values). Per shape: ms per launch (mean of -r
 * launches after two warm-ups, CUDA events) and TFLOP/s; then the GEMM time of one chunk of the 40-layer
 * model (30 DeltaNet + 10 attention layers, 40 MoE blocks) per family with its automatic tiles.
 * usage: bench_cuda_gemm [-n TOKENS (4096)] [-r REPS (20)]
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <vector>

#include "backend/cuda/cuda_internal.cuh"
#include "bench_cuda_common.cuh"

/* E stacked 4-bit matrices of rows x cols: random nibbles, scales ~0.01, biases ~-0.08 */
static dmat make_q4(int E, int rows, int cols)
{
    const size_t R = (size_t)E * rows, rb = (size_t)cols / 2, gpr = (size_t)cols / 64;
    std::vector<uint8_t> data(R * rb);
    for (auto &b : data)
        b = (uint8_t)rnd();
    std::vector<__nv_bfloat16> sc(R * gpr), bi(R * gpr);
    for (size_t i = 0; i < R * gpr; i++) {
        sc[i] = __float2bfloat16(0.005f + 0.01f * (rnd() & 1023) / 1024.0f);
        bi[i] = __float2bfloat16(-0.08f * (rnd() & 1023) / 1024.0f);
    }
    dmat m;
    memset(&m, 0, sizeof m);
    m.data = dev_upload(data);
    m.scales = dev_upload(sc);
    m.biases = dev_upload(bi);
    m.bits = 4, m.rows = rows, m.cols = cols, m.n_experts = E, m.row_bytes = (int64_t)rb;
    return m;
}

static gemm_act make_act(size_t rows, int cols)
{
    std::vector<__half> x(rows * cols);
    for (auto &v : x)
        v = __float2half((float)((int)(rnd() & 16383) - 8192));
    gemm_act a;
    a.x = dev_upload(x);
    a.xs = dev_upload(std::vector<float>(rows * (cols / 64), 1.0f));
    a.scale = dev_upload(std::vector<float>(rows, 1.0f / 8192.0f));
    a.cols = cols;
    return a;
}

static float *dev_out(size_t n)
{
    float *p;
    CK(cudaMalloc(&p, n * sizeof(float)));
    CK(cudaMemset(p, 0, n * sizeof(float)));
    return p;
}

/* mean ms of one launch_gemm(a, n) over reps launches (after two warm-ups); -1 when the launch fails */
static double time_gemm(const gemm_args &a, int n, int reps, cudaEvent_t e0, cudaEvent_t e1)
{
    for (int i = 0; i < 2; i++)
        if (launch_gemm(a, n, 0) != cudaSuccess) {
            cudaGetLastError();
            return -1.0;
        }
    CK(cudaEventRecord(e0, 0));
    for (int i = 0; i < reps; i++)
        CK(launch_gemm(a, n, 0));
    CK(cudaEventRecord(e1, 0));
    CK(cudaEventSynchronize(e1));
    float ms = 0.0f;
    CK(cudaEventElapsedTime(&ms, e0, e1));
    return ms / reps;
}

int main(int argc, char **argv)
{
    int n = 4096, reps = 20;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-n") && i + 1 < argc) n = atoi(argv[++i]);
        else if (!strcmp(argv[i], "-r") && i + 1 < argc) reps = atoi(argv[++i]);
        else {
            fprintf(stderr, "usage: %s [-n TOKENS] [-r REPS]\n", argv[0]);
            return 2;
        }
    }
    int n_dev = 0;
    if (cudaGetDeviceCount(&n_dev) != cudaSuccess || n_dev == 0 || n < 16 || reps < 1) {
        fprintf(stderr, "no CUDA device (or n < 16, reps < 1)\n");
        return 1;
    }
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    const bool wg = gemm_wgmma_available();
    printf("%s (sm_%d%d), %d tokens, %d launches per point; family chosen: %s\n", prop.name, prop.major, prop.minor,
           n, reps, gemm_kernel_choose() == GEMM_KERNEL_WGMMA ? "wgmma" : "dq");

    const int H = 2048, E = 256, K = 8, inter = 512, nk = n * K;
    /* the model's matrices (one layer's: the timing does not depend on which) */
    const dmat in_qkv = make_q4(1, 8192, H), in_z = make_q4(1, 4096, H), in_b = make_q4(1, 32, H),
               in_a = make_q4(1, 32, H), out_proj = make_q4(1, H, 4096), q_proj = make_q4(1, 8192, H),
               k_proj = make_q4(1, 512, H), v_proj = make_q4(1, 512, H), o_proj = make_q4(1, H, 4096),
               ex_gate = make_q4(E, inter, H), ex_up = make_q4(E, inter, H), ex_down = make_q4(E, H, inter),
               sh_gate = make_q4(1, inter, H), sh_up = make_q4(1, inter, H), sh_down = make_q4(1, H, inter);
    const gemm_act x_h = make_act(n, H), x_v = make_act(n, 4096), x_hid = make_act(nk, inter);
    float *y = dev_out((size_t)nk * H > (size_t)n * 12352 ? (size_t)nk * H : (size_t)n * 12352);

    /* a random top-8 routing (K distinct experts per token) and its expert plan per tile size */
    std::vector<int> idx((size_t)nk);
    for (int t = 0; t < n; t++)
        for (int k = 0; k < K; k++) {
            int e, dup;
            do {
                e = (int)(rnd() % E);
                dup = 0;
                for (int j = 0; j < k; j++)
                    dup |= idx[(size_t)t * K + j] == e;
            } while (dup);
            idx[(size_t)t * K + k] = e;
        }
    int *d_idx = dev_upload(idx), *offsets, *gather, *slot_pos, *tile_expert[3], *tile_start[3], *n_tiles[3], *counts;
    CK(cudaMalloc(&offsets, (E + 1) * sizeof(int)));
    CK(cudaMalloc(&gather, nk * sizeof(int)));
    CK(cudaMalloc(&slot_pos, nk * sizeof(int)));
    CK(cudaMalloc(&counts, (size_t)moe_plan_chunks(n) * E * sizeof(int)));
    const int tiles[3] = {16, 64, 128};
    for (int i = 0; i < 3; i++) {
        const int mt = moe_max_tiles(n, K, E, tiles[i]);
        CK(cudaMalloc(&tile_expert[i], mt * sizeof(int)));
        CK(cudaMalloc(&tile_start[i], mt * sizeof(int)));
        CK(cudaMalloc(&n_tiles[i], sizeof(int)));
        CK(launch_moe_plan(d_idx, n, K, E, tiles[i], offsets, gather, slot_pos, tile_expert[i], tile_start[i],
                           n_tiles[i], counts, 0));
    }
    CK(cudaDeviceSynchronize());

    struct shape {
        const char *name;
        int per_chunk; /* launches per chunk of the 40-layer model */
        double flops;
        gemm_args a;
        bool grouped;
    };
    std::vector<shape> shapes;
    auto dense = [&](const char *name, int per_chunk, std::vector<dmat> ms, const gemm_act &x, int epi) {
        shape s;
        memset(&s, 0, sizeof s);
        s.name = name, s.per_chunk = per_chunk, s.grouped = false;
        int rows = 0;
        for (size_t k = 0; k < ms.size(); k++) {
            s.a.m[k] = ms[k];
            s.a.y[k] = y + rows;
            s.a.row_start[k] = rows;
            rows += ms[k].rows;
        }
        for (size_t k = 0; k < ms.size(); k++)
            s.a.y_stride[k] = epi == GEMM_EPI_SWIGLU ? ms[0].rows : rows;
        s.a.row_start[ms.size()] = rows;
        s.a.n_mats = (int)ms.size();
        s.a.act = x;
        s.a.epi = epi;
        s.flops = 2.0 * rows * x.cols * n;
        shapes.push_back(s);
    };
    dense("deltanet in_proj (12352 x 2048)", 30, {in_qkv, in_z, in_b, in_a}, x_h, GEMM_EPI_STORE);
    dense("deltanet out_proj (2048 x 4096, +=)", 30, {out_proj}, x_v, GEMM_EPI_ADD);
    dense("attention q|k|v (9216 x 2048)", 10, {q_proj, k_proj, v_proj}, x_h, GEMM_EPI_STORE);
    dense("attention o_proj (2048 x 4096, +=)", 10, {o_proj}, x_v, GEMM_EPI_ADD);
    dense("shared expert gate/up (2 x 512 x 2048)", 40, {sh_gate, sh_up}, x_h, GEMM_EPI_SWIGLU);
    dense("shared expert down (2048 x 512)", 40, {sh_down}, make_act(n, inter), GEMM_EPI_STORE);
    {
        shape s;
        memset(&s, 0, sizeof s);
        s.name = "routed gate/up (256 x 2 x 512 x 2048, gathered)", s.per_chunk = 40, s.grouped = true;
        s.a.m[0] = ex_gate, s.a.m[1] = ex_up, s.a.n_mats = 2;
        s.a.y[0] = y, s.a.y_stride[0] = inter;
        s.a.act = x_h, s.a.epi = GEMM_EPI_SWIGLU, s.a.gather = gather;
        s.flops = 2.0 * 2 * inter * H * nk;
        shapes.push_back(s);
        s.name = "routed down (256 x 2048 x 512)";
        memset(&s.a, 0, sizeof s.a);
        s.a.m[0] = ex_down, s.a.n_mats = 1, s.a.row_start[1] = H;
        s.a.y[0] = y, s.a.y_stride[0] = H;
        s.a.act = x_hid, s.a.act_rows = nk, s.a.epi = GEMM_EPI_STORE;
        s.flops = 2.0 * H * inter * nk;
        shapes.push_back(s);
    }

    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    const int fams[3] = {GEMM_KERNEL_MMA, GEMM_KERNEL_MMA_DQ, GEMM_KERNEL_WGMMA};
    const char *fam_name[3] = {"mma", "dq", "wgmma"};
    double chunk_ms[3] = {0, 0, 0};
    printf("\n| GEMM | family | tile | ms | TFLOP/s |\n|---|---|---:|---:|---:|\n");
    for (const shape &s : shapes) {
        for (int f = 0; f < 3; f++) {
            if (fams[f] == GEMM_KERNEL_WGMMA && !wg)
                continue;
            const int t_auto = s.grouped ? gemm_grouped_tile(fams[f], (double)nk / E) : gemm_dense_tile(fams[f], n);
            for (int ti = 1; ti < 3; ti++) { /* 64, 128; the automatic one is marked */
                gemm_args a = s.a;
                a.kernel = fams[f];
                a.tile_tokens = tiles[ti];
                if (s.grouped) {
                    a.tile_expert = tile_expert[ti], a.tile_start = tile_start[ti], a.n_tiles = n_tiles[ti];
                    a.offsets = offsets, a.max_tiles = moe_max_tiles(n, K, E, tiles[ti]);
                }
                const double ms = time_gemm(a, n, reps, e0, e1);
                if (tiles[ti] == t_auto && ms > 0)
                    chunk_ms[f] += ms * s.per_chunk;
                printf("| %s | %s | %d%s | %.3f | %.1f |\n", s.name, fam_name[f], tiles[ti], tiles[ti] == t_auto ? " (auto)" : "",
                       ms, ms > 0 ? s.flops / ms * 1e-9 : 0.0);
            }
        }
    }
    printf("\nGEMM time of one %d-token chunk of the 40-layer model (automatic tiles):", n);
    for (int f = 0; f < 3; f++)
        if (fams[f] != GEMM_KERNEL_WGMMA || wg)
            printf(" %s %.1f ms", fam_name[f], chunk_ms[f]);
    printf("\n");
    return 0;
}
