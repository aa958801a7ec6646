//! openraft's storage conformance suite against the real sled-backed stores on disk.

use gpu_raft_store::{DataDir, LogStore, StateMachineStore, StorageError, TypeConfig};
use openraft::testing::{StoreBuilder, Suite};

struct OnDisk;

impl StoreBuilder<TypeConfig, LogStore, StateMachineStore, (tempfile::TempDir, DataDir)>
    for OnDisk
{
    async fn build(
        &self,
    ) -> Result<((tempfile::TempDir, DataDir), LogStore, StateMachineStore), StorageError> {
        let tmp = tempfile::tempdir().expect("tempdir");
        let (dir, log, sm) = gpu_raft_store::open(tmp.path()).expect("open a fresh data dir");
        Ok(((tmp, dir), log, sm))
    }
}

#[test]
fn openraft_storage_suite_passes() {
    if let Err(e) = Suite::test_all(OnDisk) {
        panic!("storage suite failed: {e}");
    }
}
