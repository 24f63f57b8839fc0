#include "spindle_prog.h"
/* Sums the object as u32 values (through an internal call), emits a label and the sum;
 * returns the number of values. */
static const char label[] = "sum=";

__attribute__((noinline)) uint64_t add_all(const uint32_t *v, uint64_t n) {
    uint64_t s = 0;
    for (uint64_t i = 0; i < n; i++) s += v[i];
    return s;
}

__attribute__((noinline)) static uint64_t twice(uint64_t x) { return x * 2; }

uint64_t spindle_main(const struct spindle_input *in) {
    uint64_t n = in->data_len / 4;
    uint64_t s = add_all((const uint32_t *)in->data, n);
    spindle_emit(label, sizeof label - 1);
    spindle_emit(&s, sizeof s);
    uint64_t t = twice(s);
    spindle_emit(&t, sizeof t);
    /* the arguments, echoed */
    spindle_emit(in->args, in->args_len);
    return n;
}
