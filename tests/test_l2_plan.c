/*
 * test_l2_plan.c — the spans of weights the CUDA decode launches ask the L2 for (l2_plan.h), on
 * any machine: expected spans worked out by hand from the rule (each issuing step asks for the
 * stream up to the window past its own start, from where the last one stopped, never its own
 * bytes), over an arena laid out as the CUDA upload lays it out (matrices in program order). The
 * GPU test (test_cuda_graph's test_l2_prefetch) holds the decode's logits unchanged with the
 * spans in use.
 */
#include "testutil.h"

#include "backend/cuda/l2_plan.h"

#define KB 1024

static _Alignas(256) uint8_t arena[1 << 20];

/* Asserts that span s is [off, off + bytes) of the arena (bytes 0: nothing). */
static void check_span(struct l2_span s, int64_t off, uint32_t bytes, const char *what)
{
    if (!bytes) {
        if (s.bytes)
            fail_msg("%s: expected nothing, got %u bytes at %td", what, s.bytes, (const uint8_t *)s.p - arena);
        return;
    }
    if (s.bytes != bytes || (const uint8_t *)s.p != arena + off)
        fail_msg("%s: expected %u bytes at %lld, got %u at %td", what, bytes, (long long)off, s.bytes,
                 s.p ? (const uint8_t *)s.p - arena : (ptrdiff_t)-1);
}

/* A layer of four steps as Qwen3's decode program has them: q|k|v (three matrices), the
 * attention (none, issues), o (one), gate|up (two); matrices back to back from the arena's
 * start. The window is 128 KB. Stream (KB): q 0-32, k 32-48, v 48-64, o 64-96, gate 96-160,
 * up 160-224; total 224. */
static void test_one_layer(void **st)
{
    (void)st;
    const int64_t sz[] = {32 * KB, 16 * KB, 16 * KB, 32 * KB, 64 * KB, 64 * KB};
    struct l2_piece pieces[6];
    int64_t off = 0;
    for (int i = 0; i < 6; i++)
        pieces[i].w = arena + off, pieces[i].bytes = sz[i], off += sz[i];
    const struct l2_step steps[] = {{3, true}, {0, true}, {1, true}, {2, true}};
    struct l2_span out[4];
    l2_plan_make(pieces, steps, 4, 128 * KB, out);
    /* q|k|v starts at 0: asks [64, 128) (its own bytes end at 64) */
    check_span(out[0], 64 * KB, 64 * KB, "q|k|v");
    /* the attention starts at 64: up to 192, from 128 */
    check_span(out[1], 128 * KB, 64 * KB, "attention");
    /* o starts at 64 too: up to 192, already asked for */
    check_span(out[2], 0, 0, "o");
    /* gate|up starts at 96: up to 224 (the end), from 192 — but its own bytes run to 224 */
    check_span(out[3], 0, 0, "gate|up");
}

/* A step whose launch cannot issue (an op the kernels do not stamp) asks for nothing and does
 * not move the point the next issuing step starts from. */
static void test_step_that_cannot_issue(void **st)
{
    (void)st;
    struct l2_piece pieces[3] = {{arena, 32 * KB}, {arena + 32 * KB, 32 * KB}, {arena + 64 * KB, 64 * KB}};
    const struct l2_step steps[] = {{1, false}, {1, true}, {1, true}};
    struct l2_span out[3];
    l2_plan_make(pieces, steps, 3, 48 * KB, out);
    check_span(out[0], 0, 0, "the step that cannot issue");
    /* the second starts at 32: up to 80, its own bytes end at 64 */
    check_span(out[1], 64 * KB, 16 * KB, "the next issuing step");
    /* the third starts at 64: up to 112, from 80; its own bytes run to 128 */
    check_span(out[2], 0, 0, "the third");
}

/* No window, or none of the steps issuing: nothing anywhere. */
static void test_off(void **st)
{
    (void)st;
    struct l2_piece pieces[2] = {{arena, 32 * KB}, {arena + 32 * KB, 32 * KB}};
    const struct l2_step steps[] = {{1, true}, {1, true}};
    struct l2_span out[2] = {{arena, 1}, {arena, 1}};
    l2_plan_make(pieces, steps, 2, 0, out);
    check_span(out[0], 0, 0, "window 0, first");
    check_span(out[1], 0, 0, "window 0, second");
    const struct l2_step quiet[] = {{1, false}, {1, false}};
    l2_plan_make(pieces, quiet, 2, 64 * KB, out);
    check_span(out[0], 0, 0, "no issuing step, first");
    check_span(out[1], 0, 0, "no issuing step, second");
}

/* Matrices with small vectors between them (as the arena holds norm weights): the span runs
 * from the part's first byte to its last, over the gaps; starts round up and ends down to 16
 * bytes. */
static void test_gaps_and_rounding(void **st)
{
    (void)st;
    struct l2_piece pieces[3] = {{arena + 8, 1000}, {arena + 2048, 4096}, {arena + 8192, 4096}};
    /* the part [0, 5096) of the stream: the first matrix from byte 8, to byte 2048 + 4096 */
    struct l2_span s = l2_stream_span(pieces, 3, 0, 5096);
    check_span(s, 16, 2048 + 4096 - 16, "two matrices with a gap, rounded");
    /* the part [1000, 3007): arena bytes 2048 .. 4055, the end rounded down to 4048 */
    s = l2_stream_span(pieces, 3, 1000, 3007);
    check_span(s, 2048, 2000, "inside the second matrix");
    /* a part ending before its first 16 bytes are whole: nothing */
    s = l2_stream_span(pieces, 3, 0, 8);
    check_span(s, 0, 0, "under 16 bytes");
}

/* Matrices out of order in memory (the envelope more than twice the part): only the first
 * matrix's piece is asked for. */
static void test_out_of_order(void **st)
{
    (void)st;
    struct l2_piece pieces[2] = {{arena + 512 * KB, 16 * KB}, {arena, 16 * KB}};
    struct l2_span s = l2_stream_span(pieces, 2, 0, 32 * KB);
    check_span(s, 512 * KB, 16 * KB, "out of order");
    /* in order with a small gap: one span over both */
    struct l2_piece near[2] = {{arena, 16 * KB}, {arena + 20 * KB, 16 * KB}};
    s = l2_stream_span(near, 2, 0, 32 * KB);
    check_span(s, 0, 36 * KB, "in order");
}

/* Layers in steady state: each issuing step asks for as many bytes as the one before it
 * streamed, the window ahead, and every byte of the stream past the first window exactly once
 * (the spans of consecutive steps touch and do not overlap). */
static void test_steady_state(void **st)
{
    (void)st;
    enum { LAYERS = 6 };
    const int64_t sz[] = {32 * KB, 32 * KB, 48 * KB, 24 * KB}; /* q|k|v, o, gate|up, down: one matrix each */
    struct l2_piece pieces[4 * LAYERS];
    struct l2_step steps[5 * LAYERS];
    struct l2_span out[5 * LAYERS];
    int64_t off = 0;
    int n = 0;
    for (int l = 0; l < LAYERS; l++)
        for (int k = 0; k < 4; k++) {
            pieces[4 * l + k].w = arena + off, pieces[4 * l + k].bytes = sz[k], off += sz[k];
            steps[n++] = (struct l2_step){1, true};
            if (k == 0)
                steps[n++] = (struct l2_step){0, true}; /* the attention after q|k|v */
        }
    const int64_t W = 100 * KB, total = off;
    l2_plan_make(pieces, steps, n, W, out);
    uintptr_t end = 0;
    int64_t asked = 0;
    for (int i = 0; i < n; i++) {
        if (!out[i].bytes)
            continue;
        if (end && (uintptr_t)out[i].p != end)
            fail_msg("step %d's span starts at %td, the one before ended at %td", i,
                     (const uint8_t *)out[i].p - arena, (const uint8_t *)end - arena);
        end = (uintptr_t)out[i].p + out[i].bytes;
        asked += out[i].bytes;
    }
    /* from the end of the first step's own bytes to the end of the stream */
    assert_int_equal(asked, total - sz[0]);
    assert_ptr_equal((const void *)end, arena + total);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_one_layer),
        cmocka_unit_test(test_step_that_cannot_issue),
        cmocka_unit_test(test_off),
        cmocka_unit_test(test_gaps_and_rounding),
        cmocka_unit_test(test_out_of_order),
        cmocka_unit_test(test_steady_state),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
