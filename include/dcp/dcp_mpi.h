/*
 * dcp_mpi.h: the MPI communicator. The only public dcp header that includes
 * <mpi.h>; programs that never use MPI need neither it nor an MPI library.
 *
 * Threads: every MPI call dcp makes runs on the thread that called
 * dcp_comm_mpi, dcp_save, dcp_save_async, dcp_request_wait,
 * dcp_request_test, dcp_load or dcp_comm_free; the background thread of an
 * asynchronous save only writes files, and dcp starts no thread that calls
 * MPI. So dcp needs no more MPI thread support than your own
 * calls do: MPI_THREAD_SINGLE is enough for a single-threaded program,
 * MPI_THREAD_FUNNELED when those calls come from the main thread of a
 * threaded one, MPI_THREAD_SERIALIZED when they come from any one thread at
 * a time.
 */
#ifndef DCP_DCP_MPI_H
#define DCP_DCP_MPI_H

#include <mpi.h>

#include "dcp.h"

#ifdef __cplusplus
extern "C" {
#endif

/*
 * Creates a dcp communicator over comm. Collective over comm: it calls
 * MPI_Comm_dup, and dcp only ever communicates on that duplicate (never on
 * comm itself, never on MPI_COMM_WORLD), so its messages cannot match
 * yours. The duplicate inherits comm's error handler: with the default
 * MPI_ERRORS_ARE_FATAL a transport failure ends the job the MPI way; with
 * MPI_ERRORS_RETURN dcp returns DCP_EIO naming the MPI error (other ranks
 * may then be left waiting, see dcp_comm.h). When MPI runs at
 * MPI_THREAD_MULTIPLE on every rank (MPI_Init_thread; MPI_Query_thread,
 * agreed by one MPI_Allreduce here), it also duplicates comm a second
 * time for dcp's point-to-point messages and sets DCP_COMM_P2P_THREAD
 * (dcp_comm.h): a tier's peer replicas then stream on a background thread
 * after its save returned (dcp_tier.h). Otherwise nothing changes.
 *  - out: receives the communicator; NULL on failure. Free it with
 *    dcp_comm_free before MPI_Finalize, after every context using it.
 * Returns DCP_OK, DCP_EINVAL (NULL out, MPI not initialised or already
 * finalised, comm is MPI_COMM_NULL or an intercommunicator), DCP_EIO
 * (MPI_Comm_dup failed), DCP_ENOMEM.
 */
DCP_API int dcp_comm_mpi(dcp_comm **out, MPI_Comm comm);

/*
 * Bounds how long each communication step dcp makes on comm may wait for
 * the other ranks: a rank that stops answering (hung, or dead under an MPI
 * that does not end the job) then makes dcp_save / dcp_load fail on the
 * ranks still running, instead of hanging, with DCP_ETIMEOUT and a message
 * naming the step. Nothing is committed: .metadata is written only after
 * every rank's data is durable, which needs the missing rank's answer.
 *
 * MPI cannot cancel a collective: after a timeout the communicator is
 * broken. Every later call on it fails at once with DCP_ETIMEOUT, and
 * dcp_comm_free releases dcp's memory but not the MPI communicator. The
 * job cannot go on communicating: report, then end it (MPI_Abort).
 *
 * Choose the timeout well above the slowest step's normal time: a save
 * waits in one step for the slowest rank's writes and fsyncs.
 *  - comm: a communicator from dcp_comm_mpi.
 *  - seconds: the bound per step; 0 (the default) waits forever.
 * Returns DCP_OK, or DCP_EINVAL (comm NULL or not from dcp_comm_mpi,
 * seconds negative, NaN or above 1e9). Local, not collective; call it on
 * every rank with the same value, when no dcp call is running on comm
 * and no replication of a tier is in flight on it (dcp_tier.h). A timeout
 * of the background replication's messages breaks only their own
 * duplicate: the next tier call reports it, the collectives go on.
 * The wait polls MPI_Test with naps of at most 1 ms.
 */
DCP_API int dcp_comm_mpi_set_timeout(dcp_comm *comm, double seconds);

#ifdef __cplusplus
}
#endif

#endif /* DCP_DCP_MPI_H */
