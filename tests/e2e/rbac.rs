//! The shipped RBAC is enough, and no more than needed: the controller runs as
//! its ServiceAccount (a bearer token) against a management API that enforces
//! the roles and bindings from `k3s-control-plane components`, through
//! bring-up from nothing, in-place propagation, an MHC remediation and teardown, with leader election on. Every request is
//! judged and recorded by the test API server: none may be denied, and every
//! granted verb must have been used (or be listed below with the one path that
//! needs it). A role missing one grant is refused by the server and changes
//! nothing.

use crate::support;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use k3s_control_plane::api::{Cluster, KThreesControlPlane};
use k3s_control_plane::apiserver::{AuthorizationRecord, TestApiServer};
use k3s_control_plane::components::{self, Options, rbac, variables};
use k3s_control_plane::controller::etcd_pool::EtcdPool;
use k3s_control_plane::controller::metrics::Metrics;
use k3s_control_plane::controller::replica_election::{self as leader, Election, ElectionConfig};
use k3s_control_plane::controller::{Context, Settings};
use k3s_control_plane::etcd::Timeouts;
use k3s_control_plane::harness::bringup::BringUp;
use k3s_control_plane::harness::infra_sim::reconcile_infrastructure;
use k3s_control_plane::harness::sandbox::{
    CLUSTER, KCP, NAMESPACE, Sandbox, fast_settings, management_server_with,
};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::{Api, ResourceExt};
use serde_json::{Value, json};
use support::{LIMIT, init_logs, machines};
use tokio_util::sync::CancellationToken;

const TOKEN: &str = "e2e-rbac-service-account-token";

fn account_user() -> String {
    format!(
        "system:serviceaccount:{}:{}",
        variables::NAMESPACE.default,
        components::NAME
    )
}

/// The role and binding objects of the components, defaults substituted.
fn rbac_objects() -> Vec<Value> {
    rbac_objects_for(&Options::default())
}

fn rbac_objects_for(options: &Options) -> Vec<Value> {
    let text = components::render_substituted(options, &BTreeMap::new()).unwrap();
    k3s_control_plane::yaml::documents::<Value>(&text)
        .unwrap()
        .into_iter()
        .filter(|o| {
            ["ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"]
                .contains(&o["kind"].as_str().unwrap_or(""))
        })
        .collect()
}

/// Store the RBAC objects with the administrator's (credential-less) client.
async fn apply(server: &TestApiServer, objects: Vec<Value>) {
    let admin = server.client();
    let mut home = k8s_openapi::api::core::v1::Namespace::default();
    home.metadata.name = Some(variables::NAMESPACE.default.into());
    Api::<k8s_openapi::api::core::v1::Namespace>::all(admin.clone())
        .create(&PostParams::default(), &home)
        .await
        .unwrap();
    for object in objects {
        let ns = object["metadata"]["namespace"].as_str().map(str::to_string);
        let post = PostParams::default();
        match object["kind"].as_str().unwrap() {
            "ClusterRole" => {
                let o: ClusterRole = serde_json::from_value(object).unwrap();
                Api::<ClusterRole>::all(admin.clone())
                    .create(&post, &o)
                    .await
                    .unwrap();
            }
            "ClusterRoleBinding" => {
                let o: ClusterRoleBinding = serde_json::from_value(object).unwrap();
                Api::<ClusterRoleBinding>::all(admin.clone())
                    .create(&post, &o)
                    .await
                    .unwrap();
            }
            "Role" => {
                let o: Role = serde_json::from_value(object).unwrap();
                Api::<Role>::namespaced(admin.clone(), &ns.unwrap())
                    .create(&post, &o)
                    .await
                    .unwrap();
            }
            "RoleBinding" => {
                let o: RoleBinding = serde_json::from_value(object).unwrap();
                Api::<RoleBinding>::namespaced(admin.clone(), &ns.unwrap())
                    .create(&post, &o)
                    .await
                    .unwrap();
            }
            other => unreachable!("{other}"),
        }
    }
}

/// A management API that enforces RBAC, holding `objects`, with a Cluster
/// and a KThreesControlPlane of `replicas` and nothing else.
async fn world(replicas: i32, objects: Vec<Value>) -> BringUp {
    let server = management_server_with(|b| {
        b.enforce_rbac()
            .service_account(TOKEN, variables::NAMESPACE.default, components::NAME)
    })
    .await
    .unwrap();
    apply(&server, objects).await;
    BringUp::start_on(server, replicas).await.unwrap()
}

/// The controller as it runs in its Pod: the ServiceAccount's token, leader
/// election in its own namespace, writes fenced by the Lease.
struct Controller {
    ctx: std::sync::Arc<Context>,
    shutdown: CancellationToken,
    task: tokio::task::JoinHandle<()>,
    election: Option<Election>,
}

impl Controller {
    async fn start(server: &TestApiServer, settings: Settings) -> Self {
        let config = kube::Config::from_custom_kubeconfig(
            server.kubeconfig_with_token(TOKEN),
            &Default::default(),
        )
        .await
        .unwrap();
        let client = kube::Client::try_from(config.clone()).unwrap();
        let election = Election::start(
            client,
            ElectionConfig::new(
                "k3s-control-plane",
                variables::NAMESPACE.default,
                "e2e-rbac-replica",
                Duration::from_secs(15),
                Duration::from_secs(10),
            )
            .unwrap(),
            |_| {},
        );
        let fenced = leader::fenced_client(config, election.guard()).unwrap();
        let mut registry = prometheus_client::registry::Registry::default();
        let metrics = Metrics::register(&mut registry);
        let timeouts = Timeouts {
            confirm: Duration::from_secs(30),
            ..Timeouts::default()
        };
        let ctx = Context::new_with_leader(
            fenced,
            metrics,
            EtcdPool::with_timeouts(timeouts),
            settings,
            election.guard(),
        );
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(leader::run_elected(ctx.clone(), shutdown.clone()));
        Controller {
            ctx,
            shutdown,
            task,
            election: Some(election),
        }
    }

    async fn stop(mut self) {
        self.shutdown.cancel();
        let _ = (&mut self.task).await;
        if let Some(election) = self.election.take() {
            election.stop().await;
        }
    }
}

fn denied(log: &[AuthorizationRecord]) -> Vec<String> {
    log.iter()
        .filter(|r| !r.allowed)
        .map(|r| {
            format!(
                "{} {} {}/{}{} {}/{}",
                r.user,
                r.verb,
                r.api_group,
                r.resource,
                if r.subresource.is_empty() {
                    String::new()
                } else {
                    format!("/{}", r.subresource)
                },
                r.namespace,
                r.name
            )
        })
        .collect()
}

/// Run the simulated infrastructure until `done` holds (bounded).
async fn drive(sandbox: &mut Sandbox, what: &str, done: impl AsyncFn(&Sandbox) -> bool) {
    let deadline = tokio::time::Instant::now() + LIMIT * 3;
    loop {
        reconcile_infrastructure(sandbox, LIMIT).await.unwrap();
        if done(sandbox).await {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{what}: not done in time"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn ready(sandbox: &Sandbox, n: usize) -> bool {
    let all = machines(sandbox).await;
    let Ok(snapshot) = sandbox.etcd.connect().snapshot().await else {
        return false;
    };
    let quorum = snapshot.assess_cluster();
    all.len() == n
        && all
            .iter()
            .all(|m| !m.is_deleting() && m.node_name().is_some())
        && quorum.voters == n
        && quorum.healthy == n
}

/// Grants of the shipped roles that this run does not need, each with the one
/// path that does (tested elsewhere).
const NOT_EXERCISED_HERE: &[(&str, &str, &str, &str)] = &[
    (
        "events.k8s.io",
        "events",
        "patch",
        "an Event repeated within kube's Recorder cache window is patched (its series count), not created again",
    ),
    (
        "",
        "secrets",
        "update",
        "kubeconfig rotation (e2e::lifecycle::kubeconfig_rotation_keeps_access)",
    ),
    (
        "bootstrap.cluster.x-k8s.io",
        "kthreesconfigs",
        "delete",
        "a Machine that cannot be created: its KThreesConfig is deleted again (e2e::faults)",
    ),
    (
        "infrastructure.cluster.x-k8s.io",
        "*",
        "delete",
        "a Machine that cannot be created: its infrastructure clone is deleted again (e2e::faults)",
    ),
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_shipped_rbac_carries_a_whole_lifecycle_and_every_grant_is_used() {
    init_logs();
    let world = world(3, rbac_objects()).await;
    let controller = Controller::start(&world.management, fast_settings()).await;
    let first = world.wait_first_machine(LIMIT).await.unwrap();
    let mut sandbox = world.boot_first(&first).await.unwrap();
    drive(&mut sandbox, "bring-up", async |s| ready(s, 3).await).await;

    // In-place propagation: Machines, infrastructure objects, KThreesConfigs.
    sandbox
        .kcp_api()
        .patch(
            KCP,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"machineTemplate": {"metadata": {"labels": {"team": "platform"}}}}})),
        )
        .await
        .unwrap();
    drive(&mut sandbox, "propagation", async |s| {
        machines(s)
            .await
            .iter()
            .all(|m| m.labels().get("team").map(String::as_str) == Some("platform"))
    })
    .await;

    // MHC remediation: hook, leadership moved off if it leads, Machine
    // deleted, member removed, hook released, replacement created.
    let victim = machines(&sandbox).await[0].name_any();
    sandbox.mark_unhealthy(&victim).await.unwrap();
    drive(&mut sandbox, "remediation", async |s| {
        let names: Vec<String> = machines(s).await.iter().map(|m| m.name_any()).collect();
        !names.contains(&victim) && ready(s, 3).await
    })
    .await;

    // Teardown: the Cluster goes, the control plane with it.
    let clusters: Api<Cluster> = Api::namespaced(sandbox.client(), NAMESPACE);
    clusters
        .delete(CLUSTER, &DeleteParams::default())
        .await
        .unwrap();
    let kcps: Api<KThreesControlPlane> = Api::namespaced(sandbox.client(), NAMESPACE);
    drive(&mut sandbox, "teardown", async |s| {
        machines(s).await.is_empty() && kcps.get_opt(KCP).await.unwrap().is_none()
    })
    .await;
    let reconciles = controller.ctx.metrics.reconciles.get();
    controller.stop().await;

    let log: Vec<AuthorizationRecord> = sandbox
        .management
        .authorization_log()
        .into_iter()
        .filter(|r| r.user == account_user())
        .collect();
    assert!(reconciles > 10, "{reconciles} reconciles");
    assert!(log.len() > 100, "only {} requests judged", log.len());
    let denied = denied(&log);
    assert!(
        denied.is_empty(),
        "denied with the shipped RBAC: {denied:#?}"
    );

    // Least privilege: every granted (group, resource, verb) was needed.
    let used: BTreeSet<(String, String, String)> = log
        .iter()
        .filter(|r| r.resource_request)
        .map(|r| {
            let resource = if r.subresource.is_empty() {
                r.resource.clone()
            } else {
                format!("{}/{}", r.resource, r.subresource)
            };
            (r.api_group.clone(), resource, r.verb.clone())
        })
        .collect();
    let mut unused = Vec::new();
    for permission in rbac::MANAGER
        .iter()
        .chain(rbac::SECRETS)
        .chain(rbac::LEADER_ELECTION)
    {
        for resource in permission.resources {
            for verb in permission.verbs {
                let hit = used.iter().any(|(g, r, v)| {
                    g == permission.group
                        && v == verb
                        && (r == resource || (*resource == "*" && !r.contains('/')))
                });
                let excused = NOT_EXERCISED_HERE
                    .iter()
                    .any(|(g, r, v, _)| *g == permission.group && r == resource && v == verb);
                if !hit && !excused {
                    unused.push(format!("{}/{} {}", permission.group, resource, verb));
                }
            }
        }
    }
    assert!(
        unused.is_empty(),
        "granted but never used in a whole lifecycle: {unused:?}; used: {used:#?}"
    );
    eprintln!(
        "e2e_rbac: {} requests judged, 0 denied, {} distinct (group, resource, verb) used: {used:?}",
        log.len(),
        used.len()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_role_without_machine_create_is_refused_and_nothing_is_created() {
    init_logs();
    let mut objects = rbac_objects();
    let manager = objects
        .iter_mut()
        .find(|o| o["kind"] == "ClusterRole" && o["metadata"]["name"] == components::MANAGER_ROLE)
        .unwrap();
    for rule in manager["rules"].as_array_mut().unwrap() {
        if rule["resources"] == json!(["machines"]) {
            rule["verbs"] = json!(["get", "list", "watch", "patch", "delete"]);
        }
    }
    let world = world(1, objects).await;
    let controller = Controller::start(&world.management, fast_settings()).await;
    let deadline = tokio::time::Instant::now() + LIMIT;
    let refusal = loop {
        let log = world.management.authorization_log();
        if let Some(r) = log
            .iter()
            .find(|r| !r.allowed && r.resource == "machines" && r.verb == "create")
        {
            break r.clone();
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no refused Machine create"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(refusal.user, account_user());
    assert_eq!(refusal.namespace, NAMESPACE);
    // The controller keeps retrying (error backoff), and nothing is created.
    let errors_before = controller.ctx.metrics.reconciles.get();
    let deadline = tokio::time::Instant::now() + LIMIT;
    while controller.ctx.metrics.reconciles.get() < errors_before + 2 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the controller stopped retrying"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let machines: Api<k3s_control_plane::api::Machine> = Api::namespaced(world.client(), NAMESPACE);
    assert!(
        machines
            .list(&Default::default())
            .await
            .unwrap()
            .items
            .is_empty()
    );
    controller.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn namespace_scoped_components_bring_a_control_plane_up_with_only_crd_reads_granted_cluster_wide()
 {
    init_logs();
    let options = Options {
        watch_namespace: Some(NAMESPACE.into()),
        ..Options::default()
    };
    let objects = rbac_objects_for(&options);
    // CRDs are cluster-scoped: `get` on them (their contract labels) is the
    // one grant beyond the namespace.
    let cluster_wide: Vec<&Value> = objects
        .iter()
        .filter(|o| o["kind"] == "ClusterRoleBinding")
        .collect();
    assert_eq!(cluster_wide.len(), 1);
    assert_eq!(
        cluster_wide[0]["roleRef"]["name"],
        k3s_control_plane::components::CONTRACT_VERSIONS_ROLE
    );
    let world = world(1, objects).await;
    let settings = Settings {
        namespace: Some(NAMESPACE.into()),
        idle_requeue: Duration::from_secs(1),
        ..fast_settings()
    };
    let controller = Controller::start(&world.management, settings).await;
    let first = world.wait_first_machine(LIMIT).await.unwrap();
    let mut sandbox = world.boot_first(&first).await.unwrap();
    drive(&mut sandbox, "bring-up", async |s| ready(s, 1).await).await;

    // Idle: nothing changes, the controller looks again every second. The
    // control plane is decided on from the watch cache, which already shows
    // the controller's own last write: no read of it per idle reconcile.
    let settled = |s: &Sandbox| {
        let api = s.kcp_api();
        async move {
            let kcp = api.get(KCP).await.ok()?;
            let status = kcp.status.as_ref()?;
            (status.ready_replicas == 1).then_some(())
        }
    };
    let deadline = tokio::time::Instant::now() + LIMIT;
    while settled(&sandbox).await.is_none() {
        assert!(tokio::time::Instant::now() < deadline, "never settled");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let idle_from = {
        let r = controller.ctx.metrics.reconciles.get();
        let deadline = tokio::time::Instant::now() + LIMIT;
        while controller.ctx.metrics.reconciles.get() < r + 2 {
            assert!(tokio::time::Instant::now() < deadline, "no idle reconcile");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        (
            sandbox.management.authorization_log().len(),
            controller.ctx.metrics.reconciles.get(),
        )
    };
    let deadline = tokio::time::Instant::now() + LIMIT;
    while controller.ctx.metrics.reconciles.get() < idle_from.1 + 4 {
        assert!(tokio::time::Instant::now() < deadline, "no idle reconciles");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let idle_reconciles = controller.ctx.metrics.reconciles.get() - idle_from.1;
    let idle: Vec<AuthorizationRecord> = sandbox.management.authorization_log()[idle_from.0..]
        .iter()
        .filter(|r| r.user == account_user() && r.resource_request)
        .cloned()
        .collect();
    let kcp_reads = idle
        .iter()
        .filter(|r| r.resource == "kthreescontrolplanes" && r.verb == "get")
        .count();
    assert_eq!(
        kcp_reads, 0,
        "the control plane was read again while idle: {idle:#?}"
    );
    let mut by_kind: BTreeMap<String, usize> = BTreeMap::new();
    for r in &idle {
        *by_kind
            .entry(format!("{} {}", r.verb, r.resource))
            .or_default() += 1;
    }
    eprintln!(
        "e2e_rbac idle: {idle_reconciles} reconciles, {} management requests ({:.1} per reconcile): {by_kind:?}",
        idle.len(),
        idle.len() as f64 / idle_reconciles as f64
    );
    controller.stop().await;
    let log: Vec<AuthorizationRecord> = sandbox
        .management
        .authorization_log()
        .into_iter()
        .filter(|r| r.user == account_user())
        .collect();
    assert!(log.len() > 20, "only {} requests judged", log.len());
    let denied = denied(&log);
    assert!(
        denied.is_empty(),
        "denied with namespace-scoped RBAC: {denied:#?}"
    );
    // Every grant came from a binding in the watched namespace or our own,
    // but reading a CRD by name (cluster-scoped: its contract labels).
    let crd_read = |r: &AuthorizationRecord| {
        r.api_group == "apiextensions.k8s.io"
            && r.resource == "customresourcedefinitions"
            && r.verb == "get"
            && !r.name.is_empty()
    };
    assert!(
        log.iter().any(crd_read),
        "the infrastructure CRD was never read"
    );
    for record in &log {
        let grant = record.grant.as_ref().unwrap();
        if record.resource_request && crd_read(record) {
            assert_eq!(
                grant.binding_name,
                k3s_control_plane::components::CONTRACT_VERSIONS_ROLE,
                "{record:?}"
            );
            continue;
        }
        if record.resource_request {
            assert_eq!(grant.binding_kind, "RoleBinding", "{record:?}");
        }
        assert!(
            record.namespace == NAMESPACE
                || record.namespace == variables::NAMESPACE.default
                || !record.resource_request,
            "a request outside the watched namespace: {record:?}"
        );
    }
}
