/* cmd_generate - `weld generate`: not yet built (placeholder until its module lands). */
#include "cli/cli.h"

#include <stdio.h>

int cmd_generate(int argc, char **argv)
{
    (void)argc;
    fprintf(stderr, "weld %s: not available in this build yet\n", argv[0]);
    return 1;
}
