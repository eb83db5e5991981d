//! The replica barrier (versioned rollout), being built: `versions` gives each change on a channel the
//! next version, persisted in the cluster; `barrier` answers which members of the channel's group have
//! applied a version. Publish and SubscribeVersions still answer UNIMPLEMENTED.

pub mod barrier;
pub mod versions;
