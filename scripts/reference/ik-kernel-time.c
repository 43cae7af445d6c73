// One matrix product on one thread through ik_llama.cpp's iqk_mul_mat, timed as
// crates/ferrox-core/examples/iq_kernels.rs times ferrox's: random weight bytes (the speed
// does not depend on the values), one to a few Q8_K activation rows (Q8_2_X4 rows for Q8_0
// and its eight-row form), the fastest of 2000 runs. Built and run by
// scripts/ik-kernel-time.sh.
//
//   ik-kernel-time TYPE_ID ROWS COLS [TOKENS]
//
// TYPE_ID is ik_llama.cpp's ggml type number: 16 IQ2_XXS, 17 IQ2_XS, 18 IQ3_XXS, 19 IQ1_S,
// 21 IQ3_S, 22 IQ2_S, 29 IQ1_M, and 200 more for the four-row interleaved (_R4) forms that
// `-rtr` repacks to (216 IQ2_XXS_R4, ...); 8 Q8_0 and 208 its eight-row form Q8_0_R8.
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

bool iqk_mul_mat(long Nx, long Ny, long ne00, int typeA, const void *A, long strideA, int typeB,
                 const void *B, long strideB, float *C, long stride_C, int ith, int nth);
void iqk_quantize_row_q8_K(const float *x, void *vy, int64_t k);
size_t ggml_row_size(int type, int64_t ne);
void ggml_quantize_init(int type);
void quantize_row_q8_2_x4(const float *x, void *vy, int64_t k);

enum { TYPE_Q8_0 = 8, TYPE_Q8_K = 15, TYPE_Q8_2_X4 = 99, TYPE_Q8_0_R8 = 208 };

static double now_us(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}

int main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: %s TYPE_ID ROWS COLS [TOKENS]\n", argv[0]);
        return 2;
    }
    int type = atoi(argv[1]);
    long rows = atol(argv[2]), cols = atol(argv[3]);
    int tokens = argc > 4 ? atoi(argv[4]) : 1;
    ggml_quantize_init(type);
    size_t row_bytes = ggml_row_size(type, cols);
    unsigned char *a = malloc(row_bytes * rows);
    srand(7);
    for (size_t i = 0; i < row_bytes * rows; i++) a[i] = rand();
    // Q8_0 and its interleaved form multiply activations quantized in blocks of 32 (Q8_2_X4).
    bool blocks32 = type == TYPE_Q8_0 || type == TYPE_Q8_0_R8;
    int act_type = blocks32 ? TYPE_Q8_2_X4 : TYPE_Q8_K;
    size_t act_bytes = ggml_row_size(act_type, cols);
    unsigned char *b = malloc(act_bytes * tokens);
    float *x = malloc(cols * sizeof(float));
    for (int t = 0; t < tokens; t++) {
        for (long i = 0; i < cols; i++) x[i] = (rand() % 1000 - 500) / 500.0f;
        if (blocks32)
            quantize_row_q8_2_x4(x, b + t * act_bytes, cols);
        else
            iqk_quantize_row_q8_K(x, b + t * act_bytes, cols);
    }
    float *c = malloc(rows * tokens * sizeof(float));
    double best = 1e30;
    for (int run = 0; run < 2000; run++) {
        double t0 = now_us();
        if (!iqk_mul_mat(rows, tokens, cols, type, a, row_bytes, act_type, b, act_bytes, c, rows,
                         0, 1)) {
            fprintf(stderr, "iqk_mul_mat has no kernel for type %d\n", type);
            return 1;
        }
        double t = now_us() - t0;
        if (t < best) best = t;
    }
    printf("type %d %ldx%ld %d tok: %.1f us\n", type, rows, cols, tokens, best);
    return 0;
}
