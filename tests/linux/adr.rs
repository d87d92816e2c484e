//! The design's decisions (DESIGN §2.1, §2.3) on real containers: a failed apply kills no
//! declared process, and a gone reason holds on every poll.

use stockade_runtime::bindings::{
    CredentialHeader, DetachedState, FacadeError, GoneReason, Grant, Rule,
};
use stockade_runtime::config::SecretBindingConfig;
use stockade_runtime::substrate::Housekeeping as _;
use stockade_runtime::substrate::Substrate;

use crate::facade::{facade_err, fx};

/// Item 1: a secret file that cannot be read when the fence opens passes every check
/// made before the substrate (it is configured and bound), so `apply-grant` fails.
/// That apply opened nothing and ran nothing: the consumer gets `invalid-input`, no
/// grant is open, and its declared server is still running (the host used to kill
/// every tracked tree after any apply failure).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_apply_kills_no_declared_process() {
    // A directory where a file is expected: configured, bound, and unreadable as a
    // secret at fence time (as root, a mode cannot make a file unreadable).
    let secret = std::env::temp_dir().join(format!(
        "stockade-adr-secret-{}-{}",
        std::process::id(),
        uuid::Uuid::new_v4()
    ));
    std::fs::create_dir(&secret).unwrap();
    let f = fx(|c| {
        c.egress.secret_files.insert("tok".into(), secret.clone());
        c.egress.secret_bindings.insert(
            "tok".into(),
            SecretBindingConfig {
                host: "api.example.com".into(),
                methods: vec!["GET".into()],
                path_prefix: None,
            },
        );
    })
    .await;
    let id =
        f.rt.start_detached("apply", &f.sh("exec sleep 1000"))
            .await
            .expect("start");
    let mut input = f.sh("echo never");
    input.grant = Some(Grant {
        rules: vec![Rule {
            host: "api.example.com".into(),
            methods: vec!["GET".into()],
            path_prefix: None,
            headers: vec![CredentialHeader {
                name: "Authorization".into(),
                secret: "tok".into(),
            }],
            intercept: true,
        }],
        ask: false,
    });
    match facade_err(f.rt.exec("apply", &input).await) {
        FacadeError::InvalidInput(why) => assert!(why.contains("tok"), "{why}"),
        other => panic!("expected invalid-input, got {other:?}"),
    }
    assert!(f.linux.open_grants().is_empty(), "a grant is open");
    assert_eq!(
        f.rt.detached_status("apply", &id).await.unwrap(),
        DetachedState::Running,
        "the declared server was killed by a fence that never opened"
    );
    f.finish().await;
    std::fs::remove_dir(&secret).unwrap();
}

/// Item 2: after the container stops (on-stop) every poll of its ids reads
/// `container-unreachable`, not only the first; one the consumer stops reads `unknown`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gone_reason_holds_on_every_poll() {
    let f = fx(|_| {}).await;
    let id =
        f.rt.start_detached("tomb", &f.sh("exec sleep 1000"))
            .await
            .expect("start");
    let container = f.linux.current("tomb").await.unwrap().expect("a container");
    // The container stops underneath the consumer; the substrate reports it.
    f.linux.stop(&container).await.unwrap();
    f.rt.on_stop(&container).await.unwrap();
    for poll in 0..3 {
        assert_eq!(
            f.rt.detached_status("tomb", &id).await.unwrap(),
            DetachedState::Gone(GoneReason::ContainerUnreachable),
            "poll {poll}"
        );
    }
    assert_eq!(
        f.rt.detached_status("other", &id).await.unwrap(),
        DetachedState::Gone(GoneReason::Unknown),
        "another key never started it"
    );
    f.rt.stop_detached("tomb", &id).await.unwrap();
    assert_eq!(
        f.rt.detached_status("tomb", &id).await.unwrap(),
        DetachedState::Gone(GoneReason::Unknown),
        "stopped by the consumer"
    );
    f.finish().await;
}
