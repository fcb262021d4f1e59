/* Built against an installed dcp by tests/install/run.sh. */
#include <stdio.h>

#include <dcp/dcp.h>

int main(void)
{
    dcp_state *st = NULL;
    int rc;

    printf("dcp %s (headers %s)\n", dcp_version_string(), DCP_VERSION_STRING);
    if (dcp_version_number() != DCP_VERSION_NUMBER) {
        fprintf(stderr, "consumer: library %u != headers %u\n",
                dcp_version_number(), (unsigned)DCP_VERSION_NUMBER);
        return 1;
    }
    rc = dcp_state_create(&st);
    if (rc != DCP_OK) {
        fprintf(stderr, "consumer: dcp_state_create: %s\n", dcp_strerror(rc));
        return 1;
    }
    dcp_state_free(st);
    printf("consumer: ok\n");
    return 0;
}
