/* cmd_mkmodel - `weld mkmodel`: not yet built (placeholder until its module lands). */
#include "cli/cli.h"

#include <stdio.h>

int cmd_mkmodel(int argc, char **argv)
{
    (void)argc;
    fprintf(stderr, "weld %s: not available in this build yet\n", argv[0]);
    return 1;
}
