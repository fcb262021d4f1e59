#!/bin/sh
# Open MPI's launch agent for the cluster (plm_rsh_agent): instead of ssh,
# runs the remote daemon's command line inside the node's namespaces.
#   agent.sh HOST COMMAND-LINE...
exec "$(dirname "$0")/cluster.sh" agent "$@"
