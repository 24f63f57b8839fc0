#include "spindle_prog.h"
/* Never ends. */
uint64_t spindle_main(const struct spindle_input *in) {
    volatile uint64_t x = 0;
    for (;;) x++;
    return x;
}
