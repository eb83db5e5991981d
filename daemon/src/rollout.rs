//! The replica barrier (versioned rollout), being built: `versions` gives each change on a channel the
//! next version, persisted in the cluster. The RolloutService RPCs still answer UNIMPLEMENTED.

pub mod versions;
