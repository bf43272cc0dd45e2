/* One function, toggle(), that switches callgrind's instruction counting on or off:
 * tools/count_manager_instructions.py calls it where the replay reads its clock. */
#include <valgrind/callgrind.h>

void toggle(void) { CALLGRIND_TOGGLE_COLLECT; }
