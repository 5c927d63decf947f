//! RBAC enforcement (`TestApiServerBuilder::enforce_rbac`): token users are judged
//! against the ClusterRoles, ClusterRoleBindings, Roles and RoleBindings stored when
//! each request arrives, with the real 401/403 `Status` bodies and messages.
//!
//! In-process only (skipped when `KUBECONFIG` is set): the users are bearer tokens
//! registered with the test server, which a real cluster does not know, and every
//! test binds ClusterRoles, which a shared cluster should not get from a test suite.

use std::net::{IpAddr, Ipv4Addr};

use futures::{StreamExt, TryStreamExt};
use k3s_control_plane::apiserver::{
    AuthorizationRecord, ResourceDef, Scope, ServerTls, TestApiServer,
};
use k3s_control_plane::harness::TestCa;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Pod, Secret};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use kube::Client;
use kube::api::{
    Api, DynamicObject, ListParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams,
};
use rcgen::{ExtendedKeyUsagePurpose, SanType};
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::support::*;

/// The controller's service account, as a pod would present its token.
const SA_TOKEN: &str = "conformance-sa-token";
const SA_NS: &str = "ctl-system";
const SA_USER: &str = "system:serviceaccount:ctl-system:controller";
/// A plain user in group `devs`.
const JANE_TOKEN: &str = "conformance-jane-token";

struct World {
    server: TestApiServer,
    /// The credential-less administrator: never judged.
    admin: Client,
    /// The service account's client.
    sa: Client,
}

impl World {
    /// Create `obj` (of type `K`) as the administrator, in its namespace if it has one.
    async fn apply<K>(&self, obj: serde_json::Value)
    where
        K: kube::Resource<DynamicType = ()> + serde::Serialize + serde::de::DeserializeOwned,
    {
        let typed: K = serde_json::from_value(obj).expect("a valid object");
        let resource = kube::api::ApiResource::erase::<K>(&());
        let mut obj: DynamicObject =
            serde_json::from_value(serde_json::to_value(&typed).unwrap()).unwrap();
        obj.types = Some(kube::api::TypeMeta {
            api_version: resource.api_version.clone(),
            kind: resource.kind.clone(),
        });
        let api: Api<DynamicObject> = match obj.metadata.namespace.as_deref() {
            Some(ns) => Api::namespaced_with(self.admin.clone(), ns, &resource),
            None => Api::all_with(self.admin.clone(), &resource),
        };
        api.create(&PostParams::default(), &obj)
            .await
            .expect("the administrator creates anything");
    }

    fn denied(&self) -> Vec<AuthorizationRecord> {
        self.server
            .authorization_log()
            .into_iter()
            .filter(|r| !r.allowed)
            .collect()
    }
}

/// A server enforcing RBAC with namespaces `team-a`, `team-b` and `ctl-system`;
/// `None` (test skipped) against a real cluster.
async fn world() -> Option<World> {
    if std::env::var_os("KUBECONFIG").is_some() {
        eprintln!("skipped against a real cluster: its users are not the test server's tokens");
        return None;
    }
    k3s_control_plane::install_crypto_provider();
    let server = TestApiServer::builder()
        .with_core_resources()
        .resource(
            ResourceDef::new(kcp_resource(), Scope::Namespaced)
                .with_status()
                .with_scale(".spec.replicas", ".status.replicas", None),
        )
        .enforce_rbac()
        .service_account(SA_TOKEN, SA_NS, "controller")
        .user(JANE_TOKEN, "jane", &["devs"])
        .start()
        .await
        .expect("test API server starts");
    let admin = server.client();
    for ns in ["team-a", "team-b", SA_NS] {
        let mut namespace = Namespace::default();
        namespace.metadata.name = Some(ns.into());
        Api::<Namespace>::all(admin.clone())
            .create(&PostParams::default(), &namespace)
            .await
            .unwrap();
    }
    let sa = server.client_with_token(SA_TOKEN);
    Some(World { server, admin, sa })
}

fn sa_subject() -> serde_json::Value {
    json!([{"kind": "ServiceAccount", "name": "controller", "namespace": SA_NS}])
}

async fn cluster_role(w: &World, name: &str, rules: serde_json::Value) {
    w.apply::<ClusterRole>(json!({"metadata": {"name": name}, "rules": rules}))
        .await;
}

async fn bind_cluster_role(w: &World, role: &str, subjects: serde_json::Value) {
    w.apply::<ClusterRoleBinding>(json!({
        "metadata": {"name": role},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
        "subjects": subjects,
    }))
    .await;
}

async fn role_binding(w: &World, ns: &str, name: &str, kind: &str, role: &str) {
    w.apply::<RoleBinding>(json!({
        "metadata": {"name": name, "namespace": ns},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": kind, "name": role},
        "subjects": sa_subject(),
    }))
    .await;
}

fn secret(name: &str) -> Secret {
    let mut s = Secret::default();
    s.metadata.name = Some(name.into());
    s
}

fn forbidden(status: &kube::core::Status, message: &str) {
    assert_eq!(status.code, 403, "{status:?}");
    assert_eq!(status.reason, "Forbidden");
    assert_eq!(status.message, message);
}

#[tokio::test]
async fn rbac_cluster_role_binding_lets_a_service_account_get_list_and_watch() {
    let Some(w) = world().await else { return };
    cluster_role(
        &w,
        "cm-reader",
        json!([{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "list", "watch"]}]),
    )
    .await;
    bind_cluster_role(&w, "cm-reader", sa_subject()).await;
    let admin_cms: Api<ConfigMap> = Api::namespaced(w.admin.clone(), "team-a");
    admin_cms
        .create(&PostParams::default(), &config_map("cm-1", &[]))
        .await
        .unwrap();

    let cms: Api<ConfigMap> = Api::namespaced(w.sa.clone(), "team-a");
    assert_eq!(
        cms.get("cm-1").await.unwrap().metadata.name.as_deref(),
        Some("cm-1")
    );
    let list = cms.list(&ListParams::default()).await.unwrap();
    assert_eq!(list.items.len(), 1);
    // A ClusterRoleBinding grants at cluster scope too.
    let everywhere: Api<ConfigMap> = Api::all(w.sa.clone());
    assert_eq!(
        everywhere
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .len(),
        1
    );

    let rv = list.metadata.resource_version.unwrap();
    let mut events = cms
        .watch(&WatchParams::default().timeout(10), &rv)
        .await
        .unwrap()
        .boxed();
    admin_cms
        .create(&PostParams::default(), &config_map("cm-2", &[]))
        .await
        .unwrap();
    let added = tokio::time::timeout(DEADLINE, events.try_next())
        .await
        .expect("the watch delivers")
        .unwrap();
    assert!(
        matches!(&added, Some(WatchEvent::Added(cm)) if cm.metadata.name.as_deref() == Some("cm-2")),
        "{added:?}"
    );

    // Not granted: create. A create names no object (the name is in the body).
    let status = status_of(
        cms.create(&PostParams::default(), &config_map("cm-3", &[]))
            .await,
    );
    forbidden(
        &status,
        &format!(
            "configmaps is forbidden: User \"{SA_USER}\" cannot create resource \"configmaps\" in API group \"\" in the namespace \"team-a\""
        ),
    );
    let verbs: Vec<(String, bool)> = w
        .server
        .authorization_log()
        .into_iter()
        .map(|r| (r.verb, r.allowed))
        .collect();
    let expected = [
        ("get", true),
        ("list", true),
        ("list", true),
        ("watch", true),
        ("create", false),
    ];
    assert_eq!(
        verbs,
        expected.map(|(v, a)| (v.to_string(), a)).to_vec(),
        "the administrator's requests are not judged"
    );
}

#[tokio::test]
async fn rbac_role_binding_grants_only_in_its_namespace() {
    let Some(w) = world().await else { return };
    w.apply::<Role>(json!({
        "metadata": {"name": "secret-reader", "namespace": "team-a"},
        "rules": [{"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]}],
    }))
    .await;
    role_binding(&w, "team-a", "secret-reader", "Role", "secret-reader").await;
    for ns in ["team-a", "team-b"] {
        Api::<Secret>::namespaced(w.admin.clone(), ns)
            .create(&PostParams::default(), &secret("s"))
            .await
            .unwrap();
    }
    let in_a: Api<Secret> = Api::namespaced(w.sa.clone(), "team-a");
    assert!(in_a.get("s").await.is_ok());

    let in_b: Api<Secret> = Api::namespaced(w.sa.clone(), "team-b");
    let status = status_of(in_b.get("s").await);
    forbidden(
        &status,
        &format!(
            "secrets \"s\" is forbidden: User \"{SA_USER}\" cannot get resource \"secrets\" in API group \"\" in the namespace \"team-b\""
        ),
    );
    let details = status.details.expect("a 403 carries details");
    assert_eq!(
        (
            details.name.as_str(),
            details.group.as_str(),
            details.kind.as_str()
        ),
        ("s", "", "secrets")
    );

    // Nor at cluster scope: no namespace in the message.
    let all: Api<Secret> = Api::all(w.sa.clone());
    forbidden(
        &status_of(all.list(&ListParams::default()).await),
        &format!(
            "secrets is forbidden: User \"{SA_USER}\" cannot list resource \"secrets\" in API group \"\" at the cluster scope"
        ),
    );

    // A RoleBinding to a ClusterRole also grants only in the binding's namespace.
    cluster_role(
        &w,
        "cm-lister",
        json!([{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["list"]}]),
    )
    .await;
    role_binding(&w, "team-b", "cm-lister", "ClusterRole", "cm-lister").await;
    let cms_b: Api<ConfigMap> = Api::namespaced(w.sa.clone(), "team-b");
    assert!(cms_b.list(&ListParams::default()).await.is_ok());
    let cms_a: Api<ConfigMap> = Api::namespaced(w.sa.clone(), "team-a");
    assert_eq!(
        status_of(cms_a.list(&ListParams::default()).await).code,
        403
    );
}

#[tokio::test]
async fn rbac_resource_names_limit_get_but_not_list() {
    let Some(w) = world().await else { return };
    cluster_role(
        &w,
        "one-secret",
        json!([{"apiGroups": [""], "resources": ["secrets"], "resourceNames": ["allowed"],
                "verbs": ["get", "list", "watch"]}]),
    )
    .await;
    role_binding(&w, "team-a", "one-secret", "ClusterRole", "one-secret").await;
    let admin: Api<Secret> = Api::namespaced(w.admin.clone(), "team-a");
    for name in ["allowed", "other"] {
        admin
            .create(&PostParams::default(), &secret(name))
            .await
            .unwrap();
    }
    let secrets: Api<Secret> = Api::namespaced(w.sa.clone(), "team-a");
    assert!(secrets.get("allowed").await.is_ok());
    forbidden(
        &status_of(secrets.get("other").await),
        &format!(
            "secrets \"other\" is forbidden: User \"{SA_USER}\" cannot get resource \"secrets\" in API group \"\" in the namespace \"team-a\""
        ),
    );
    // A list names no object, so resourceNames cannot allow it...
    forbidden(
        &status_of(secrets.list(&ListParams::default()).await),
        &format!(
            "secrets is forbidden: User \"{SA_USER}\" cannot list resource \"secrets\" in API group \"\" in the namespace \"team-a\""
        ),
    );
    // ...unless a metadata.name field selector names it, as upstream.
    let one = secrets
        .list(&ListParams::default().fields("metadata.name=allowed"))
        .await
        .unwrap();
    assert_eq!(one.items.len(), 1);
}

#[tokio::test]
async fn rbac_status_subresource_needs_its_own_rule() {
    let Some(w) = world().await else { return };
    w.apply::<Role>(json!({
        "metadata": {"name": "kcp-status", "namespace": "team-a"},
        "rules": [
            {"apiGroups": [KCP_GROUP], "resources": ["kthreescontrolplanes"], "verbs": ["get"]},
            {"apiGroups": [KCP_GROUP], "resources": ["kthreescontrolplanes/status"], "verbs": ["patch"]},
        ],
    }))
    .await;
    role_binding(&w, "team-a", "kcp-status", "Role", "kcp-status").await;
    Api::<DynamicObject>::namespaced_with(w.admin.clone(), "team-a", &kcp_resource())
        .create(&PostParams::default(), &kcp("kcp-1"))
        .await
        .unwrap();
    let kcps: Api<DynamicObject> = Api::namespaced_with(w.sa.clone(), "team-a", &kcp_resource());
    let patch = Patch::Merge(json!({"status": {"replicas": 1}}));
    kcps.patch_status("kcp-1", &PatchParams::default(), &patch)
        .await
        .expect("patch of kthreescontrolplanes/status is granted");

    let status = status_of(
        kcps.patch(
            "kcp-1",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": 5}})),
        )
        .await,
    );
    forbidden(
        &status,
        &format!(
            "kthreescontrolplanes.{KCP_GROUP} \"kcp-1\" is forbidden: User \"{SA_USER}\" cannot patch resource \"kthreescontrolplanes\" in API group \"{KCP_GROUP}\" in the namespace \"team-a\""
        ),
    );
    assert_eq!(status.details.unwrap().kind, "kthreescontrolplanes");
    // A rule for the status subresource does not cover scale.
    forbidden(
        &status_of(
            kcps.patch_scale(
                "kcp-1",
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"replicas": 5}})),
            )
            .await,
        ),
        &format!(
            "kthreescontrolplanes.{KCP_GROUP} \"kcp-1\" is forbidden: User \"{SA_USER}\" cannot patch resource \"kthreescontrolplanes/scale\" in API group \"{KCP_GROUP}\" in the namespace \"team-a\""
        ),
    );
}

#[tokio::test]
async fn rbac_aggregated_cluster_role_picks_up_a_labelled_role_added_later() {
    let Some(w) = world().await else { return };
    const LABEL: &str = "rbac.example.com/aggregate-to-devs";
    w.apply::<ClusterRole>(json!({
        "metadata": {"name": "devs"},
        "aggregationRule": {"clusterRoleSelectors": [{"matchLabels": {LABEL: "true"}}]},
        "rules": [],
    }))
    .await;
    bind_cluster_role(
        &w,
        "devs",
        json!([{"kind": "Group", "name": "devs", "apiGroup": "rbac.authorization.k8s.io"}]),
    )
    .await;
    let jane: Api<ConfigMap> = Api::namespaced(w.server.client_with_token(JANE_TOKEN), "team-a");
    forbidden(
        &status_of(jane.list(&ListParams::default()).await),
        "configmaps is forbidden: User \"jane\" cannot list resource \"configmaps\" in API group \"\" in the namespace \"team-a\"",
    );
    // An unlabelled role is not aggregated; a labelled one is, from the next request.
    let rules = json!([{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["list"]}]);
    cluster_role(&w, "unlabelled", rules.clone()).await;
    assert_eq!(status_of(jane.list(&ListParams::default()).await).code, 403);
    w.apply::<ClusterRole>(json!({
        "metadata": {"name": "cm-list", "labels": {LABEL: "true"}}, "rules": rules,
    }))
    .await;
    assert!(jane.list(&ListParams::default()).await.is_ok());
    let grant = w
        .server
        .authorization_log()
        .last()
        .unwrap()
        .grant
        .clone()
        .unwrap();
    assert_eq!(
        (
            grant.binding_kind.as_str(),
            grant.role_name.as_str(),
            grant.rule_source.as_str()
        ),
        ("ClusterRoleBinding", "devs", "cm-list")
    );
}

#[tokio::test]
async fn rbac_unknown_token_is_unauthorized_401() {
    let Some(w) = world().await else { return };
    let stranger: Api<ConfigMap> =
        Api::namespaced(w.server.client_with_token("no-such-token"), "team-a");
    let status = status_of(stranger.list(&ListParams::default()).await);
    assert_eq!(status.code, 401);
    assert_eq!(status.reason, "Unauthorized");
    assert_eq!(status.message, "Unauthorized");
    // Discovery too: authentication comes first.
    let err = w
        .server
        .client_with_token("no-such-token")
        .apiserver_version()
        .await
        .unwrap_err();
    assert!(
        matches!(&err, kube::Error::Api(s) if s.code == 401),
        "{err:?}"
    );
    assert!(w.server.authorization_log().is_empty(), "nobody to judge");
    // The credential-less administrator is unaffected.
    assert!(
        Api::<ConfigMap>::namespaced(w.admin.clone(), "team-a")
            .list(&ListParams::default())
            .await
            .is_ok()
    );
}

#[tokio::test]
async fn rbac_denial_is_a_kube_api_error_with_reason_forbidden_and_code_403() {
    let Some(w) = world().await else { return };
    let secrets: Api<Secret> = Api::namespaced(w.sa.clone(), "team-a");
    match secrets.get("x").await {
        Err(kube::Error::Api(status)) => {
            assert_eq!(status.code, 403);
            assert_eq!(status.reason, "Forbidden");
            assert!(status.is_forbidden());
            assert_eq!(
                status.message,
                format!(
                    "secrets \"x\" is forbidden: User \"{SA_USER}\" cannot get resource \"secrets\" in API group \"\" in the namespace \"team-a\""
                )
            );
        }
        other => panic!("expected a 403 API error, got {other:?}"),
    }
    // Authorization comes before routing: an unserved resource is 403 too, not 404.
    let widgets = kube::api::ApiResource {
        group: "example.com".into(),
        version: "v1".into(),
        api_version: "example.com/v1".into(),
        kind: "Widget".into(),
        plural: "widgets".into(),
    };
    let unserved: Api<DynamicObject> = Api::namespaced_with(w.sa.clone(), "team-a", &widgets);
    assert_eq!(
        status_of(unserved.list(&ListParams::default()).await).code,
        403
    );
    // A binding whose role does not exist is named in the reason.
    bind_cluster_role(&w, "absent", sa_subject()).await;
    forbidden(
        &status_of(secrets.get("x").await),
        &format!(
            "secrets \"x\" is forbidden: User \"{SA_USER}\" cannot get resource \"secrets\" in API group \"\" in the namespace \"team-a\": RBAC: clusterrole.rbac.authorization.k8s.io \"absent\" not found"
        ),
    );
}

#[tokio::test]
async fn rbac_discovery_is_allowed_for_every_authenticated_user() {
    let Some(w) = world().await else { return };
    // No binding at all for the service account.
    assert!(w.sa.apiserver_version().await.is_ok());
    let discovery = kube::discovery::Discovery::new(w.sa.clone())
        .run()
        .await
        .expect("discovery of /api and /apis is allowed");
    assert!(discovery.has_group(KCP_GROUP));
    assert!(w.denied().is_empty(), "{:?}", w.denied());
    // Resources are not.
    let cms: Api<ConfigMap> = Api::namespaced(w.sa.clone(), "team-a");
    assert_eq!(status_of(cms.list(&ListParams::default()).await).code, 403);
    // Nor are other non-resource paths.
    let request = http::Request::get("/metrics").body(Vec::new()).unwrap();
    let status = status_of(w.sa.request::<serde_json::Value>(request).await);
    forbidden(
        &status,
        &format!("forbidden: User \"{SA_USER}\" cannot get path \"/metrics\""),
    );
    let version = w
        .server
        .authorization_log()
        .into_iter()
        .find(|r| r.path == "/version")
        .unwrap();
    assert!(!version.resource_request && version.allowed);
    assert_eq!(version.grant.unwrap().binding_name, "system:discovery");
}

#[tokio::test]
async fn rbac_authorization_log_records_decisions_and_grants() {
    let Some(w) = world().await else { return };
    cluster_role(
        &w,
        "pods",
        json!([{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "delete"]},
               {"apiGroups": [""], "resources": ["pods/status"], "verbs": ["patch"]}]),
    )
    .await;
    role_binding(&w, "team-a", "pods", "ClusterRole", "pods").await;
    let pods: Api<Pod> = Api::namespaced(w.sa.clone(), "team-a");
    assert!(pods.list(&ListParams::default()).await.is_ok());
    assert_eq!(
        status_of(pods.get("p-1").await).code,
        404,
        "allowed, then not found"
    );
    assert_eq!(
        status_of(pods.create(&PostParams::default(), &Pod::default()).await).code,
        403
    );

    let log = w.server.authorization_log();
    assert_eq!(log.len(), 3);
    let allowed = &log[1];
    assert_eq!(
        (
            allowed.user.as_str(),
            allowed.verb.as_str(),
            allowed.api_group.as_str(),
            allowed.resource.as_str(),
            allowed.subresource.as_str(),
            allowed.namespace.as_str(),
            allowed.name.as_str(),
            allowed.allowed
        ),
        (SA_USER, "get", "", "pods", "", "team-a", "p-1", true)
    );
    let grant = allowed.grant.as_ref().unwrap();
    assert_eq!(
        (
            grant.binding_kind.as_str(),
            grant.binding_namespace.as_deref(),
            grant.binding_name.as_str(),
            grant.role_kind.as_str(),
            grant.role_name.as_str()
        ),
        ("RoleBinding", Some("team-a"), "pods", "ClusterRole", "pods")
    );
    assert_eq!(grant.rule.verbs, vec!["get", "list", "delete"]);
    let denied = w.denied();
    assert_eq!(denied.len(), 1);
    assert_eq!(
        (denied[0].verb.as_str(), denied[0].grant.is_none()),
        ("create", true)
    );

    // Least privilege: which granted rules no request used.
    let granted: ClusterRole = Api::all(w.admin.clone()).get("pods").await.unwrap();
    let used: Vec<_> = log
        .iter()
        .filter_map(|r| r.grant.as_ref())
        .map(|g| g.rule.clone())
        .collect();
    let unused: Vec<_> = granted
        .rules
        .unwrap()
        .into_iter()
        .filter(|r| !used.contains(r))
        .collect();
    assert_eq!(unused.len(), 1);
    assert_eq!(
        unused[0].resources.as_deref(),
        Some(&["pods/status".to_string()][..])
    );
}

#[tokio::test]
async fn rbac_bearer_token_from_a_kubeconfig_travels_over_plain_http() {
    let Some(w) = world().await else { return };
    bind_cluster_role(
        &w,
        "ns-reader",
        json!([{"kind": "User", "name": "jane", "apiGroup": "rbac.authorization.k8s.io"}]),
    )
    .await;
    cluster_role(
        &w,
        "ns-reader",
        json!([{"apiGroups": [""], "resources": ["namespaces"], "verbs": ["get", "list"]}]),
    )
    .await;
    let kubeconfig = w.server.kubeconfig_with_token(JANE_TOKEN);
    let yaml = k3s_control_plane::yaml::to_string(&kubeconfig).unwrap();
    assert!(yaml.contains(&format!("token: {JANE_TOKEN}")), "{yaml}");
    assert!(w.server.url().starts_with("http://"));
    let config = kube::Config::from_custom_kubeconfig(
        k3s_control_plane::yaml::from_str(&yaml).unwrap(),
        &Default::default(),
    )
    .await
    .unwrap();
    let jane = Client::try_from(config).unwrap();
    let namespaces: Api<Namespace> = Api::all(jane);
    let names: Vec<String> = namespaces
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter_map(|n| n.metadata.name)
        .collect();
    assert!(names.contains(&"team-a".to_string()), "{names:?}");
    let record = w.server.authorization_log().pop().unwrap();
    assert_eq!(
        (record.user.as_str(), record.allowed),
        ("jane", true),
        "the token reached the server"
    );
    // Namespaces are cluster-scoped: the message has no namespace part.
    let cms: Api<ConfigMap> = Api::all(w.server.client_with_token(JANE_TOKEN));
    forbidden(
        &status_of(cms.list(&ListParams::default()).await),
        "configmaps is forbidden: User \"jane\" cannot list resource \"configmaps\" in API group \"\" at the cluster scope",
    );
}

#[tokio::test]
async fn rbac_port_forward_needs_get_and_create_on_pods_portforward() {
    let Some(w) = world().await else { return };
    let echo = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let echo_addr = echo.local_addr().unwrap();
    tokio::spawn(async move {
        let (mut conn, _) = echo.accept().await.unwrap();
        let mut buf = [0u8; 2];
        conn.read_exact(&mut buf).await.unwrap();
        conn.write_all(&buf).await.unwrap();
    });
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "proxy", "namespace": "team-a"},
        "spec": {"containers": [{"name": "proxy", "image": "proxy"}]},
    }))
    .unwrap();
    Api::<Pod>::namespaced(w.admin.clone(), "team-a")
        .create(&PostParams::default(), &pod)
        .await
        .unwrap();
    w.server
        .set_port_forward_target("team-a", "proxy", 2379, echo_addr);
    w.apply::<Role>(json!({
        "metadata": {"name": "forward", "namespace": "team-a"},
        "rules": [{"apiGroups": [""], "resources": ["pods/portforward"], "verbs": ["get"]}],
    }))
    .await;
    role_binding(&w, "team-a", "forward", "Role", "forward").await;
    let pods: Api<Pod> = Api::namespaced(w.sa.clone(), "team-a");
    assert!(
        pods.portforward("proxy", &[2379]).await.is_err(),
        "get alone is not enough"
    );
    let last = w.server.authorization_log().pop().unwrap();
    assert_eq!(
        (
            last.verb.as_str(),
            last.resource.as_str(),
            last.subresource.as_str(),
            last.allowed
        ),
        ("create", "pods", "portforward", false)
    );
    assert_eq!(w.server.port_forwards_opened("team-a", "proxy"), 0);

    let rules = json!({"rules": [{"apiGroups": [""], "resources": ["pods/portforward"], "verbs": ["get", "create"]}]});
    Api::<Role>::namespaced(w.admin.clone(), "team-a")
        .patch("forward", &PatchParams::default(), &Patch::Merge(rules))
        .await
        .unwrap();
    let mut forwarder = pods.portforward("proxy", &[2379]).await.unwrap();
    let mut stream = forwarder.take_stream(2379).unwrap();
    stream.write_all(b"ok").await.unwrap();
    let mut answer = [0u8; 2];
    tokio::time::timeout(DEADLINE, stream.read_exact(&mut answer))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(&answer, b"ok");
    assert_eq!(w.server.port_forwards_opened("team-a", "proxy"), 1);
}

#[tokio::test]
async fn rbac_client_certificate_common_name_is_the_user() {
    if std::env::var_os("KUBECONFIG").is_some() {
        eprintln!("skipped against a real cluster: the client CA is the test's");
        return;
    }
    k3s_control_plane::install_crypto_provider();
    let server_ca = TestCa::new("k3s-server-ca@1700000000");
    let client_ca = TestCa::new("k3s-client-ca@1700000000");
    let serving = server_ca.issue(
        "k3s",
        &[SanType::IpAddress(IpAddr::V4(Ipv4Addr::LOCALHOST))],
        &[ExtendedKeyUsagePurpose::ServerAuth],
    );
    let controller = client_ca.issue(
        "kcp-controller",
        &[],
        &[ExtendedKeyUsagePurpose::ClientAuth],
    );
    let server = TestApiServer::builder()
        .with_core_resources()
        .enforce_rbac()
        .tls(ServerTls {
            ca_pem: server_ca.pair.cert_pem.clone(),
            cert_pem: serving.cert_pem,
            key_pem: serving.key_pem,
            client_ca_pem: Some(client_ca.pair.cert_pem.clone()),
            client_identity: None,
        })
        .start()
        .await
        .unwrap();
    let kubeconfig = server.kubeconfig_with_identity(&controller.cert_pem, &controller.key_pem);
    let client = Client::try_from(
        kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
            .await
            .unwrap(),
    )
    .unwrap();
    let cms: Api<ConfigMap> = Api::namespaced(client, "default");
    forbidden(
        &status_of(cms.list(&ListParams::default()).await),
        "configmaps is forbidden: User \"kcp-controller\" cannot list resource \"configmaps\" in API group \"\" in the namespace \"default\"",
    );
}

#[tokio::test]
async fn rbac_objects_load_from_a_yaml_manifest() {
    let Some(w) = world().await else { return };
    let manifest = format!(
        r#"
apiVersion: v1
kind: Namespace
metadata:
  name: shipped-system
---
apiVersion: v1
kind: ServiceAccount
metadata:
  name: controller
  namespace: {SA_NS}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata:
  name: shipped
rules:
  - apiGroups: ["{KCP_GROUP}"]
    resources: ["kthreescontrolplanes"]
    verbs: ["get", "list", "watch"]
  - apiGroups: ["{KCP_GROUP}"]
    resources: ["kthreescontrolplanes/status"]
    verbs: ["patch"]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata:
  name: shipped
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: ClusterRole
  name: shipped
subjects:
  - kind: ServiceAccount
    name: controller
    namespace: {SA_NS}
---
"#
    );
    let skipped = w.server.create_from_yaml(&manifest).unwrap();
    assert_eq!(skipped, vec!["ServiceAccount/controller"], "not served");
    let kcps: Api<DynamicObject> = Api::all_with(w.sa.clone(), &kcp_resource());
    assert!(kcps.list(&ListParams::default()).await.is_ok());
    let in_shipped: Api<ConfigMap> = Api::namespaced(w.sa.clone(), "shipped-system");
    assert_eq!(
        status_of(in_shipped.list(&ListParams::default()).await).code,
        403
    );
    // A document the server cannot create is an error naming it.
    let err = w
        .server
        .create_from_yaml(
            "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: cm\n  namespace: absent\n",
        )
        .unwrap_err();
    assert!(err.to_string().contains("document 0"), "{err}");
    assert!(err.to_string().contains("ConfigMap/cm"), "{err}");
}

#[tokio::test]
async fn rbac_without_enforcement_tokens_are_authenticated_but_not_judged() {
    if std::env::var_os("KUBECONFIG").is_some() {
        eprintln!("skipped against a real cluster: its users are not the test server's tokens");
        return;
    }
    let server = TestApiServer::builder()
        .with_core_resources()
        .user(JANE_TOKEN, "jane", &[])
        .start()
        .await
        .unwrap();
    let jane: Api<Secret> = Api::namespaced(server.client_with_token(JANE_TOKEN), "default");
    jane.create(&PostParams::default(), &secret("s"))
        .await
        .expect("no RBAC: everything is allowed");
    assert!(server.authorization_log().is_empty(), "nothing judged");
    let stranger: Api<Secret> = Api::namespaced(server.client_with_token("other"), "default");
    assert_eq!(status_of(stranger.get("s").await).code, 401);
    // RBAC objects are not served either.
    let roles: Api<ClusterRole> = Api::all(server.client());
    assert_eq!(
        status_of(roles.list(&ListParams::default()).await).code,
        404
    );
}
