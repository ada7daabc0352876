/* test_cuda_sampling.cu — the device sampler (backend/cuda/sampling/) against the host sampler
 * (runtime/sampler.h), its oracle, on logits rows of the real vocabulary size (248,320) and a small one
 * full of exact ties. Exits 77 (CTest: skipped) when no GPU is present.
 *
 * For each setting (greedy with a penalty; temperature with top-k off, top-p over the whole vocabulary,
 * Qwen's recommendation, min-p, top-k past the exact-rank buffer, penalties with logit bias, a narrow
 * top-p): DRAWS consecutive draws on the device (each token counted for the penalties as the decode loop
 * counts it) and the host sampler's draws with the same seed, draw indices and history. Both use the
 * same Gumbel-max noise on bit-identical scaled logits, so the tokens must be identical except where the
 * top-p cut moved by float rounding (fixed-point vs double mass sums): at least 99% identical, and every
 * greedy draw. A statistical check on a peaked row (total variation over the 12 likeliest tokens and
 * the rest, 20,000 draws) guards the distribution itself; logprobs (top 5) against runtime/logprobs.h
 * within 1e-4; a NaN logit raises the step's non-finite flag. Prints the time per token of each setting.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <vector>

#include "backend/cuda/sampling/sampling.cuh"

extern "C" {
#include "runtime/logprobs.h"
#include "runtime/sampler.h"
}

#define CUDA_TEST_SEED 0x5eed5eedull
#include "cuda_test_util.cuh"

static int g_fail = 0, g_checks = 0;

static double urand(void) { return rnd_u32() / 4294967296.0; }

static void expect(bool ok, const char *fmt, const char *what, double a, double b)
{
    g_checks++;
    if (!ok)
        g_fail++;
    printf("%s %s: ", ok ? "ok  " : "FAIL", what);
    printf(fmt, a, b);
    printf("\n");
}

/* The device side of one row of logits: the workspace and the decode loop's token bookkeeping. */
struct rig {
    int vocab, cap;
    sample_workspace ws;
    float *logits;
    int *slots, *out, *step, *n_generated;
    int *host_tokens, *host_tokens_dev;
    cudaStream_t stream;
};

static void rig_new(rig &r, int vocab, int cap)
{
    r.vocab = vocab;
    r.cap = cap;
    CK(cuda_sampling_new(vocab, &r.ws));
    CK(cudaMalloc(&r.logits, (size_t)vocab * 4));
    CK(cudaMalloc(&r.slots, 8));
    CK(cudaMalloc(&r.out, (size_t)cap * 4));
    CK(cudaMalloc(&r.step, 4));
    CK(cudaMalloc(&r.n_generated, 4));
    CK(cudaHostAlloc(&r.host_tokens, ((size_t)cap + 1) * 4, cudaHostAllocMapped));
    CK(cudaHostGetDevicePointer(&r.host_tokens_dev, r.host_tokens, 0));
    CK(cudaStreamCreate(&r.stream));
}

static void rig_free(rig &r)
{
    cuda_sampling_free(&r.ws);
    cudaFree(r.logits);
    cudaFree(r.slots);
    cudaFree(r.out);
    cudaFree(r.step);
    cudaFree(r.n_generated);
    cudaFreeHost(r.host_tokens);
    cudaStreamDestroy(r.stream);
}

static sample_args rig_args(const rig &r)
{
    sample_args a;
    memset(&a, 0, sizeof a);
    a.logits = r.logits;
    a.vocab = r.vocab;
    a.token_slots = r.slots;
    a.out_tokens = r.out;
    a.out_cap = r.cap;
    a.step = r.step;
    a.n_generated = r.n_generated;
    a.host_tokens = r.host_tokens_dev;
    a.token_info = r.ws.info_dev;
    return a;
}

/* The decode loop's settings for sampler params sp and sampler s's history (as generate.c fills them). */
struct device_settings {
    lily_device_sampling ds;
    std::vector<int32_t> hist_ids, bias_ids;
    std::vector<uint32_t> hist_counts;
    std::vector<float> bias_values;
};

static void settings_for(device_settings &d, const lily_sampler_params &sp, const lily_sampler *s, int vocab,
                         int top_logprobs)
{
    memset(&d.ds, 0, sizeof d.ds);
    d.ds.temperature = sp.temperature;
    d.ds.top_k = sp.top_k;
    d.ds.top_p = sp.top_p;
    d.ds.min_p = sp.min_p;
    d.ds.presence_penalty = sp.presence_penalty;
    d.ds.frequency_penalty = sp.frequency_penalty;
    d.ds.repetition_penalty = sp.repetition_penalty;
    d.ds.seed = sp.seed;
    d.ds.draw0 = lily_sampler_draw_index(s);
    d.ds.top_logprobs = top_logprobs;
    d.hist_ids.assign(vocab, 0);
    d.hist_counts.assign(vocab, 0);
    d.ds.n_history = lily_sampler_history(s, d.hist_ids.data(), d.hist_counts.data());
    d.ds.history_ids = d.hist_ids.data();
    d.ds.history_counts = d.hist_counts.data();
    for (int i = 0; i < sp.n_logit_bias; i++) {
        d.bias_ids.push_back(sp.logit_bias[i].token);
        d.bias_values.push_back(sp.logit_bias[i].bias);
    }
    d.ds.n_bias = sp.n_logit_bias;
    d.ds.bias_ids = d.bias_ids.data();
    d.ds.bias_values = d.bias_values.data();
}

/* n draws on the device from the row in r.logits with settings ds (tokens into got[n]); returns the
 * microseconds per draw (device time). */
static double device_draws(rig &r, const lily_device_sampling &ds, int n, std::vector<int> &got)
{
    CK(cudaMemsetAsync(r.step, 0, 4, r.stream));
    CK(cudaMemsetAsync(r.n_generated, 0, 4, r.stream));
    CK(cuda_sampling_upload(&r.ws, &ds, r.stream));
    const sample_args a = rig_args(r);
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    CK(cudaEventRecord(e0, r.stream));
    for (int i = 0; i < n; i++)
        CK(cuda_sampling_enqueue(&r.ws, a, &ds, r.stream));
    CK(cudaEventRecord(e1, r.stream));
    CK(cudaStreamSynchronize(r.stream));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, e0, e1));
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    got.assign(n, -1);
    CK(cudaMemcpy(got.data(), r.out, (size_t)n * 4, cudaMemcpyDeviceToHost));
    return 1000.0 * ms / n;
}

/* A row like a language model's: a long tail and a few strong candidates. */
static void lm_row(std::vector<float> &x, int vocab, int n_strong, float strong)
{
    x.resize(vocab);
    for (int i = 0; i < vocab; i++)
        x[i] = (float)(2.0 * (urand() + urand() + urand() - 1.5));
    for (int j = 0; j < n_strong; j++)
        x[(int)(urand() * 0.999 * vocab)] += strong * (float)(0.5 + 0.5 * urand());
}

static const int32_t g_prompt[] = {11, 5, 93, 200, 301, 7, 42, 480, 3, 64, 5, 5, 93};

/* One setting: DRAWS device draws against the host sampler's. */
static void compare_setting(rig &r, const std::vector<float> &row, const char *name, lily_sampler_params sp,
                            int draws, bool exact)
{
    lily_error err;
    memset(&err, 0, sizeof err);
    lily_sampler *s = NULL;
    if (lily_sampler_new(&sp, r.vocab, &s, &err) != LILY_OK) {
        printf("FAIL %s: sampler: %s\n", name, err.message);
        g_fail++;
        return;
    }
    lily_sampler_add_context(s, g_prompt, (int)(sizeof g_prompt / sizeof *g_prompt), &err);
    lily_sampler_accept(s, 5, &err); /* two earlier generated tokens */
    lily_sampler_accept(s, 93, &err);
    lily_sampler_set_draw_index(s, 2);
    device_settings d;
    settings_for(d, sp, s, r.vocab, -1);
    CK(cudaMemcpy(r.logits, row.data(), (size_t)r.vocab * 4, cudaMemcpyHostToDevice));
    std::vector<int> got;
    const double us = device_draws(r, d.ds, draws, got);
    int same = 0;
    for (int i = 0; i < draws; i++) {
        const int32_t want = lily_sampler_sample(s, row.data());
        same += got[i] == want;
        lily_sampler_accept(s, got[i] >= 0 && got[i] < r.vocab ? got[i] : want, &err); /* the device counted its own */
    }
    lily_sampler_free(s);
    char what[160];
    snprintf(what, sizeof what, "%-44s vocab %6d: identical draws", name, r.vocab);
    const double share = (double)same / draws;
    expect(exact ? same == draws : share >= 0.99, "%.4f of the host sampler's (%.2f us per token)", what, share, us);
}

/* The drawn distribution itself on a peaked row: TV distance between device draws and the host's
 * candidate probabilities over the 12 likeliest tokens and the rest. */
static void distribution_check(rig &r)
{
    std::vector<float> row;
    lm_row(row, r.vocab, 12, 9.0f);
    lily_sampler_params sp = lily_sampler_defaults();
    sp.top_p = 0.95f;
    sp.seed = 99;
    lily_error err;
    memset(&err, 0, sizeof err);
    lily_sampler *s = NULL;
    lily_sampler_new(&sp, r.vocab, &s, &err);
    std::vector<int32_t> ids(r.vocab);
    std::vector<float> probs(r.vocab);
    const int n = lily_sampler_candidates(s, row.data(), ids.data(), probs.data());
    const int K = n < 12 ? n : 12;
    device_settings d;
    settings_for(d, sp, s, r.vocab, -1);
    lily_sampler_free(s);
    CK(cudaMemcpy(r.logits, row.data(), (size_t)r.vocab * 4, cudaMemcpyHostToDevice));
    const int draws = 20000;
    std::vector<int> got;
    device_draws(r, d.ds, draws, got);
    std::vector<double> seen(K + 1, 0.0), want(K + 1, 0.0);
    double rest = 1.0;
    for (int k = 0; k < K; k++) {
        want[k] = probs[k];
        rest -= probs[k];
    }
    want[K] = rest;
    for (int i = 0; i < draws; i++) {
        int k = 0;
        while (k < K && ids[k] != got[i])
            k++;
        seen[k] += 1.0 / draws;
    }
    double tv = 0;
    for (int k = 0; k <= K; k++)
        tv += 0.5 * fabs(seen[k] - want[k]);
    expect(tv < 0.03, "total variation %.4f (bound %.2f)", "distribution of 20000 top-p 0.95 draws", tv, 0.03);
}

/* Logprobs (top 5) of each draw against runtime/logprobs.h on the raw row. */
static void logprobs_check(rig &r)
{
    std::vector<float> row;
    lm_row(row, r.vocab, 30, 8.0f);
    lily_sampler_params sp = lily_sampler_defaults();
    sp.top_k = 20;
    sp.top_p = 0.95f;
    sp.presence_penalty = 1.5f;
    sp.seed = 5;
    lily_error err;
    memset(&err, 0, sizeof err);
    lily_sampler *s = NULL;
    lily_sampler_new(&sp, r.vocab, &s, &err);
    device_settings d;
    settings_for(d, sp, s, r.vocab, 5);
    lily_sampler_free(s);
    CK(cudaMemcpy(r.logits, row.data(), (size_t)r.vocab * 4, cudaMemcpyHostToDevice));
    const int draws = 64;
    std::vector<int> got;
    const double us = device_draws(r, d.ds, draws, got);
    double worst = 0;
    int bad_ids = 0;
    for (int i = 0; i < draws; i++) {
        lily_token_logprobs want;
        lily_logprobs_compute(row.data(), r.vocab, got[i], 5, &want);
        const sample_token_info &info = r.ws.info_host[i % SAMPLE_INFO_RING];
        if (!info.has_logprobs || info.lp.n_top != 5)
            bad_ids++;
        worst = fmax(worst, fabs((double)info.lp.logprob - want.logprob));
        for (int k = 0; k < 5; k++) {
            bad_ids += info.lp.top_ids[k] != want.top_ids[k];
            worst = fmax(worst, fabs((double)info.lp.top_logprobs[k] - want.top_logprobs[k]));
        }
    }
    char what[128];
    snprintf(what, sizeof what, "logprobs + top 5, vocab %d (%.2f us per token)", r.vocab, us);
    expect(worst <= 1e-4 && bad_ids == 0, "worst |error| %.3g, %g wrong ids or counts", what, worst, (double)bad_ids);
}

/* A NaN logit raises the step's flag; a clean row does not. */
static void nonfinite_check(rig &r)
{
    std::vector<float> row;
    lm_row(row, r.vocab, 5, 6.0f);
    lily_sampler_params sp = lily_sampler_defaults();
    lily_error err;
    memset(&err, 0, sizeof err);
    lily_sampler *s = NULL;
    lily_sampler_new(&sp, r.vocab, &s, &err);
    device_settings d;
    settings_for(d, sp, s, r.vocab, -1);
    lily_sampler_free(s);
    int flags[2];
    for (int k = 0; k < 2; k++) {
        if (k == 1)
            row[r.vocab / 3] = NAN;
        CK(cudaMemcpy(r.logits, row.data(), (size_t)r.vocab * 4, cudaMemcpyHostToDevice));
        std::vector<int> got;
        device_draws(r, d.ds, 1, got);
        flags[k] = r.ws.info_host[0].flags;
    }
    expect(flags[0] == 0 && flags[1] == SAMPLE_FLAG_NONFINITE, "clean row flags %g, NaN row flags %g",
           "non-finite logits flagged", flags[0], flags[1]);
}

static void run_vocab(int vocab, bool ties)
{
    rig r;
    rig_new(r, vocab, 20480);
    std::vector<float> row;
    lm_row(row, vocab, 40, 7.0f);
    if (ties) /* quantized to quarter nats: thousands of exact ties for the ranks to break by id */
        for (float &v : row)
            v = roundf(v * 4.0f) / 4.0f;
    static const lily_logit_bias bias[] = {{7, 4.0f}, {42, -100.0f}, {300, 2.0f}, {64, 1.5f}};
    struct {
        const char *name;
        lily_sampler_params sp;
        bool exact;
    } cases[9];
    for (int i = 0; i < 9; i++) {
        cases[i].sp = lily_sampler_defaults();
        cases[i].sp.seed = 1000 + (uint64_t)i;
        cases[i].exact = false;
    }
    cases[0].name = "greedy, presence 1.5";
    cases[0].sp.temperature = 0.0f, cases[0].sp.presence_penalty = 1.5f, cases[0].exact = true;
    cases[1].name = "temperature 1, top-k off, top-p 1";
    cases[2].name = "temperature 1, top-p 0.95 (whole vocab)";
    cases[2].sp.top_p = 0.95f;
    cases[3].name = "Qwen: t 1, top-k 20, top-p 0.95, presence 1.5";
    cases[3].sp.top_k = 20, cases[3].sp.top_p = 0.95f, cases[3].sp.presence_penalty = 1.5f;
    cases[4].name = "t 0.7, top-k 300, min-p 0.05";
    cases[4].sp.temperature = 0.7f, cases[4].sp.top_k = 300, cases[4].sp.min_p = 0.05f;
    cases[5].name = "t 1, top-k 5000, top-p 0.9";
    cases[5].sp.top_k = 5000, cases[5].sp.top_p = 0.9f;
    cases[6].name = "t 0.8, repetition 1.3, frequency 0.4, bias";
    cases[6].sp.temperature = 0.8f, cases[6].sp.repetition_penalty = 1.3f, cases[6].sp.frequency_penalty = 0.4f;
    cases[6].sp.top_p = 0.9f, cases[6].sp.logit_bias = bias, cases[6].sp.n_logit_bias = 4;
    cases[7].name = "t 1, top-p 0.5";
    cases[7].sp.top_p = 0.5f;
    cases[8].name = "t 1, top-k 1 (greedy)";
    cases[8].sp.top_k = 1, cases[8].exact = true;
    for (int i = 0; i < 9; i++)
        compare_setting(r, row, cases[i].name, cases[i].sp, 400, cases[i].exact);
    if (!ties) {
        distribution_check(r);
        logprobs_check(r);
        nonfinite_check(r);
    }
    rig_free(r);
}

int main(void)
{
    if (cuda_test_no_device())
        return 77;
    run_vocab(248320, false);
    run_vocab(1000, true);
    printf("%s: %d of %d checks failed\n", g_fail ? "FAIL" : "ok", g_fail, g_checks);
    return g_fail ? 1 : 0;
}
