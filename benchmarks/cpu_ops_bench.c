/* Times every CPU op at one training shape, forward and backward, to show where a step's
 * time goes.  usage: cpu_ops_bench [B T C NH V] (default 8 128 256 4 4096) */
#include <stdio.h>
#include <stdlib.h>

#include "engine/backend.h"
#include "engine/timing.h"

static float *buf(size_t n) {
    float *x = malloc(n * sizeof(float)); /* [n] */
    for (size_t i = 0; i < n; i++) x[i] = (float)((i * 2654435761u) % 1000) / 1000.0f - 0.5f;
    return x;
}

static double g_total = 0;

static void report(const char *what, double ms, int per_step) {
    g_total += ms * per_step;
    printf("%-28s %9.3f ms  x%-3d = %8.2f ms/step\n", what, ms, per_step, ms * per_step);
}

int main(int argc, char **argv) {
    int B = 8, T = 128, C = 256, NH = 4, V = 4096, L = 4;
    if (argc == 6) {
        B = atoi(argv[1]); T = atoi(argv[2]); C = atoi(argv[3]); NH = atoi(argv[4]); V = atoi(argv[5]);
    }
    int N = B * T, reps = 5;
    const gptc_backend *be = cpu_backend();
    if (!be) return 1;
    float *x = buf((size_t)N * 4 * C), *y = buf((size_t)N * 4 * C), *dx = buf((size_t)N * 4 * C);
    float *w = buf((size_t)4 * C * C), *dw = buf((size_t)4 * C * C), *b = buf(4 * C), *db = buf(4 * C);
    float *qkv = buf((size_t)N * 3 * C), *dqkv = buf((size_t)N * 3 * C);
    float *att = buf((size_t)B * NH * T * T), *datt = buf((size_t)B * NH * T * T);
    float *logits = buf((size_t)N * V), *wte = buf((size_t)V * C), *dwte = buf((size_t)V * C);
    float *mean = buf(N), *rstd = buf(N), *loss = buf(N);
    int32_t *tgt = malloc(sizeof(int32_t) * N);
    for (int i = 0; i < N; i++) tgt[i] = (i * 7) % V;
    printf("shape B %d T %d C %d NH %d V %d, %d layers\n", B, T, C, NH, V, L);

#define TIME(what, per_step, call)                                       \
    do {                                                                 \
        call;                                                            \
        double t0 = timing_now_ms();                                     \
        for (int r = 0; r < reps; r++) call;                             \
        report(what, (timing_now_ms() - t0) / reps, per_step);           \
    } while (0)

    TIME("matmul fwd C->3C", L, be->matmul_forward(qkv, x, w, b, N, C, 3 * C, 0, NULL));
    TIME("matmul bwd C->3C", L, be->matmul_backward(dx, dw, db, qkv, x, w, N, C, 3 * C, 0, NULL));
    TIME("matmul fwd C->C", L, be->matmul_forward(y, x, w, b, N, C, C, 0, NULL));
    TIME("matmul bwd C->C", L, be->matmul_backward(dx, dw, db, y, x, w, N, C, C, 0, NULL));
    TIME("matmul fwd C->4C", L, be->matmul_forward(y, x, w, b, N, C, 4 * C, 0, NULL));
    TIME("matmul bwd C->4C", L, be->matmul_backward(dx, dw, db, y, x, w, N, C, 4 * C, 0, NULL));
    TIME("matmul fwd 4C->C", L, be->matmul_forward(y, x, w, b, N, 4 * C, C, 0, NULL));
    TIME("matmul bwd 4C->C", L, be->matmul_backward(dx, dw, db, y, x, w, N, 4 * C, C, 0, NULL));
    TIME("attention fwd", L, be->attention_forward(y, att, qkv, B, T, C, NH, NULL));
    TIME("attention bwd", L,
         be->attention_backward(dqkv, NULL, datt, y, y, qkv, att, B, T, C, NH, NULL));
    TIME("layernorm fwd", 2 * L + 1, be->layernorm_forward(y, mean, rstd, x, w, b, N, C, NULL));
    TIME("layernorm bwd", 2 * L + 1,
         be->layernorm_backward(dx, dw, db, NULL, y, x, w, mean, rstd, N, C, NULL));
    TIME("gelu fwd", L, be->gelu_forward(y, x, (size_t)N * 4 * C, NULL));
    TIME("gelu bwd", L, be->gelu_backward(dx, x, y, (size_t)N * 4 * C, NULL));
    TIME("residual add", 2 * L, be->add(y, x, dx, (size_t)N * C, NULL));
    TIME("lm head fwd", 1, be->matmul_forward(logits, x, wte, NULL, N, C, V, 1, NULL));
    float *stats = buf(2 * N);
    TIME("crossentropy fwd+bwd", 1, be->cross_entropy(loss, logits, mean, stats, tgt, N, V, V, 1.0f, NULL));
    TIME("lm head bwd", 1, be->matmul_backward(dx, dwte, NULL, logits, x, wte, N, C, V, 1, NULL));
    size_t P = (size_t)12 * C * C * L + (size_t)V * C;
    float *p = buf(P), *g = buf(P), *m = buf(P), *v = buf(P);
    for (size_t i = 0; i < P; i++) v[i] = v[i] * v[i];
    gptc_adamw_piece all = {p, NULL, g, m, v, P, 0.1f};
    gptc_adamw_step h = {.gscale = 1.0f, .lr = 1e-4f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f,
                         .bc1 = 0.5f, .bc2 = 0.5f};
    TIME("adamw (all params)", 1, be->adamw(&all, 1, &h, NULL));
    TIME("grad norm (all params)", 1, be->sum_squares(g, P, NULL));
    printf("%-28s %34.2f ms/step (per micro-batch of %d tokens, + optimizer)\n", "total", g_total, N);
    return 0;
}
