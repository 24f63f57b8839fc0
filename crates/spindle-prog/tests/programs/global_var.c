#include "spindle_prog.h"
/* A written global. */
uint64_t counter;
uint64_t spindle_main(const struct spindle_input *in) {
    counter++;
    return counter;
}
