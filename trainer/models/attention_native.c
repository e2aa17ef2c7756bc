/* The default model's self-attention on a CPU, forward and backward, one thread, fp32: trainer.models.attention_native
   builds this file with the token count NT, the heads NH and the head width NHD as constants and calls it through
   ctypes.  Per example and head every matrix is held with the query index i innermost (padded to TP lanes), so the
   products are broadcasts times vectors over i, the softmax over the keys j is elementwise across rows, and q, k, v
   are read from (and their gradients written to) the projections' own (B, T, 3D) layout, with no permute copies.
   The sums over i (the keys' and values' gradients) run four partial sums, so that FMA latency does not bound them.
   Measured by python -m bench.dense_step (docs/reports/2026-12-04-dense-step.md). */
#include <math.h>
#include <stdint.h>
#include <string.h>

enum { T = NT, H = NH, HD = NHD, D = NH * NHD, ROW = 3 * NH * NHD, TP = (NT + 15) / 16 * 16 };

#pragma omp declare simd notinbranch
static inline float exp_neg(float x) { /* exp(x), x <= 0: 2^n p(r), relative error < 2e-7 */
    x = x < -87.0f ? -87.0f : x;
    float n = __builtin_floorf(x * 1.44269504088896341f + 0.5f);
    float r = x - n * 0.693359375f + n * 2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    int32_t e = ((int32_t)n + 127) << 23;
    float s;
    memcpy(&s, &e, 4);
    return p * s;
}

/* qkv (B, T, 3D) -> out (B, T, D); wt (B, H, T, T) the softmax weights as [key j][query i]; keept the same layout
   or NULL. */
void attention_forward(const float *restrict qkv, const float *restrict keept, float *restrict out,
                       float *restrict wt, int64_t B) {
    const float scale = 1.0f / sqrtf((float)HD);
    float qt[HD][TP] __attribute__((aligned(64)));
    float s[T][TP] __attribute__((aligned(64)));
    float ot[HD][TP] __attribute__((aligned(64)));
    float m[TP] __attribute__((aligned(64))), sum[TP] __attribute__((aligned(64)));
    for (int64_t b = 0; b < B; b++) {
        const float *x = qkv + b * T * ROW;
        for (int h = 0; h < H; h++) {
            const float *q = x + h * HD, *k = x + D + h * HD, *v = x + 2 * D + h * HD;
            memset(qt, 0, sizeof qt);
            for (int i = 0; i < T; i++)
                for (int e = 0; e < HD; e++) qt[e][i] = q[i * ROW + e] * scale;
            for (int j = 0; j < T; j++) {
                float acc[TP] __attribute__((aligned(64))) = {0};
                for (int e = 0; e < HD; e++) {
                    const float kje = k[j * ROW + e];
                    for (int i = 0; i < TP; i++) acc[i] += kje * qt[e][i];
                }
                memcpy(s[j], acc, sizeof acc);
            }
            for (int i = 0; i < TP; i++) m[i] = s[0][i];
            for (int j = 1; j < T; j++)
                for (int i = 0; i < TP; i++) m[i] = s[j][i] > m[i] ? s[j][i] : m[i];
            for (int i = 0; i < TP; i++) sum[i] = 0.0f;
            for (int j = 0; j < T; j++)
                for (int i = 0; i < TP; i++) { s[j][i] = exp_neg(s[j][i] - m[i]); sum[i] += s[j][i]; }
            for (int i = 0; i < TP; i++) sum[i] = 1.0f / sum[i];
            float *wb = wt + ((int64_t)b * H + h) * T * T;
            const float *kb = keept ? keept + ((int64_t)b * H + h) * T * T : NULL;
            memset(ot, 0, sizeof ot);
            for (int j = 0; j < T; j++) {
                for (int i = 0; i < TP; i++) s[j][i] *= sum[i];
                for (int i = 0; i < T; i++) wb[j * T + i] = s[j][i];
                if (kb) for (int i = 0; i < T; i++) s[j][i] *= kb[j * T + i];
                for (int e = 0; e < HD; e++) {
                    const float vje = v[j * ROW + e];
                    for (int i = 0; i < TP; i++) ot[e][i] += vje * s[j][i];
                }
            }
            float *o = out + b * T * D + h * HD;
            for (int i = 0; i < T; i++)
                for (int e = 0; e < HD; e++) o[i * D + e] = ot[e][i];
        }
    }
}

/* go (B, T, D), the output's gradient -> g (B, T, 3D), the gradient of qkv. */
void attention_backward(const float *restrict qkv, const float *restrict keept, const float *restrict wt,
                        const float *restrict go, float *restrict g, int64_t B) {
    const float scale = 1.0f / sqrtf((float)HD);
    float got[HD][TP] __attribute__((aligned(64))), qt[HD][TP] __attribute__((aligned(64)));
    float gqt[HD][TP] __attribute__((aligned(64)));
    float w[TP] __attribute__((aligned(64))), wd[TP] __attribute__((aligned(64)));
    float gs[T][TP] __attribute__((aligned(64)));
    float dot[TP] __attribute__((aligned(64)));
    float gop[TP][HD] __attribute__((aligned(64))), qp[TP][HD] __attribute__((aligned(64)));
    for (int64_t b = 0; b < B; b++) {
        const float *x = qkv + b * T * ROW;
        float *gx = g + b * T * ROW;
        for (int h = 0; h < H; h++) {
            const float *q = x + h * HD, *k = x + D + h * HD, *v = x + 2 * D + h * HD;
            const float *gob = go + b * T * D + h * HD;
            memset(got, 0, sizeof got);
            memset(qt, 0, sizeof qt);
            memset(w, 0, sizeof w);
            memset(wd, 0, sizeof wd);
            memset(gop, 0, sizeof gop);
            memset(qp, 0, sizeof qp);
            for (int i = 0; i < T; i++)
                for (int e = 0; e < HD; e++) {
                    got[e][i] = gop[i][e] = gob[i * D + e];
                    qt[e][i] = qp[i][e] = q[i * ROW + e];
                }
            const float *wb = wt + ((int64_t)b * H + h) * T * T;
            const float *kb = keept ? keept + ((int64_t)b * H + h) * T * T : NULL;
            for (int i = 0; i < TP; i++) dot[i] = 0.0f;
            for (int j = 0; j < T; j++) {
                for (int i = 0; i < T; i++) { w[i] = wb[j * T + i]; wd[i] = kb ? w[i] * kb[j * T + i] : w[i]; }
                float gw[TP] __attribute__((aligned(64))) = {0}; /* the weights' gradient, row j */
                for (int e = 0; e < HD; e++) {
                    const float vje = v[j * ROW + e];
                    for (int i = 0; i < TP; i++) gw[i] += vje * got[e][i];
                }
                if (kb) for (int i = 0; i < T; i++) gw[i] *= kb[j * T + i];
                for (int i = 0; i < TP; i++) { gs[j][i] = gw[i] * w[i]; dot[i] += gs[j][i]; }
                float *gvj = gx + j * ROW + 2 * D + h * HD; /* gv_j = sum_i wd_ij go_i */
                float accv[4][HD] = {{0}};            /* four independent sums: FMA latency, not throughput, bound one */
                for (int i = 0; i < TP; i += 4)
                    for (int u = 0; u < 4; u++) {
                        const float a = wd[i + u];
#pragma omp simd
                        for (int e = 0; e < HD; e++) accv[u][e] += a * gop[i + u][e];
                    }
                for (int e = 0; e < HD; e++) accv[0][e] += accv[1][e] + accv[2][e] + accv[3][e];
                for (int e = 0; e < HD; e++) gvj[e] = accv[0][e];
            }
            memset(gqt, 0, sizeof gqt);
            for (int j = 0; j < T; j++) {
                for (int i = 0; i < TP; i++) { w[i] = i < T ? wb[j * T + i] : 0.0f; }
                for (int i = 0; i < TP; i++) gs[j][i] = (gs[j][i] - w[i] * dot[i]) * scale; /* w (gw - dot) */
                for (int e = 0; e < HD; e++) {
                    const float kje = k[j * ROW + e];
                    for (int i = 0; i < TP; i++) gqt[e][i] += kje * gs[j][i];
                }
                float *gkj = gx + j * ROW + D + h * HD; /* gk_j = sum_i gs_ij q_i */
                float acck[4][HD] = {{0}};
                for (int i = 0; i < TP; i += 4)
                    for (int u = 0; u < 4; u++) {
                        const float a = gs[j][i + u];
#pragma omp simd
                        for (int e = 0; e < HD; e++) acck[u][e] += a * qp[i + u][e];
                    }
                for (int e = 0; e < HD; e++) acck[0][e] += acck[1][e] + acck[2][e] + acck[3][e];
                for (int e = 0; e < HD; e++) gkj[e] = acck[0][e];
            }
            float *gq = gx + h * HD;
            for (int i = 0; i < T; i++)
                for (int e = 0; e < HD; e++) gq[i * ROW + e] = gqt[e][i];
        }
    }
}
