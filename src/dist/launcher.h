// Where this process sits in a multi-process launch, read from the launcher's environment:
// OpenMPI's mpirun, Slurm's srun, a PMI launcher (MPICH/Intel MPI hydra), or torchrun. Nothing
// set means one process alone. CPU-only: no MPI or CUDA here.
#pragma once

#include <map>
#include <string>

namespace ab::dist {

struct LaunchInfo {
  std::string launcher = "none";  // "openmpi", "slurm", "pmi", "torchrun" or "none"
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int local_size = 1;  // processes on this node; 0 when the launcher does not say
};

// The first launcher whose rank variable is set wins, in the order openmpi (OMPI_COMM_WORLD_*),
// slurm (a task of an srun step: SLURM_PROCID, SLURM_STEP_NUM_TASKS, SLURM_LOCALID, and
// SLURM_STEP_TASKS_PER_NODE, SLURM_NTASKS_PER_NODE or SLURM_TASKS_PER_NODE with SLURM_NODEID; a
// batch script's own SLURM_* variables, without SLURM_STEP_NUM_TASKS, are no launch), pmi (PMI_RANK, PMI_SIZE, MPI_LOCALRANKID, MPI_LOCALNRANKS), torchrun (RANK,
// WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE). Throws UsageError naming the variables when that
// launcher's values are missing, not integers, or inconsistent (rank outside the world, local
// rank outside the node, more processes on a node than in the world).
LaunchInfo parse_launcher_env(const std::map<std::string, std::string>& env);

// This process's environment, for parse_launcher_env.
std::map<std::string, std::string> process_environment();

// The device a rank uses: local_rank % visible_devices. Throws Error when no device is visible.
int device_for_rank(const LaunchInfo& info, int visible_devices);

}  // namespace ab::dist
