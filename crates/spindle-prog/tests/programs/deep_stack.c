#include "spindle_prog.h"
/* Recursion that never reaches its end, with a big frame each. */
__attribute__((noinline)) uint64_t down(uint64_t n) {
    volatile uint8_t frame[256];
    if (n == 0xdeadbeefcafeULL) return 0;
    frame[n % 256] = (uint8_t)n;
    return down(n + 1) + frame[(n + 1) % 256];
}
uint64_t spindle_main(const struct spindle_input *in) {
    return down(in->data_len);
}
