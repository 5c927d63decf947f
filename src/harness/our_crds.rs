//! Our CRDs in a test API server, as a management cluster serves them with our
//! conversion webhook running: an object written or read in any served version
//! is converted by our own conversion, as the real API server would have our
//! webhook convert it.

use std::sync::Arc;

use crate::api::conversion::KnownApiVersions;
use crate::api::crds;
use crate::apiserver::{Converter, ResourceDef, TestApiServerBuilder};

/// Our conversion (the webhook's), as the test API server calls it. The only
/// place that names it. `versions`: the API versions of the kinds our objects
/// reference by group only, which the webhook reads from their CRDs' contract
/// labels (the converter cannot ask the server it runs in).
fn our_converter(versions: KnownApiVersions) -> Converter {
    Arc::new(move |object, desired| {
        crate::api::conversion::convert(object, desired, &versions).map_err(|e| e.to_string())
    })
}

/// `builder` serving every served version of our CRDs, converted by our
/// conversion (registered for their API group) with `versions` (see
/// [`our_converter`]).
pub fn with_our_crds(
    mut builder: TestApiServerBuilder,
    versions: KnownApiVersions,
) -> TestApiServerBuilder {
    for crd in crds::ours() {
        builder = builder
            .converter(&crd.spec.group, our_converter(versions.clone()))
            .resource(ResourceDef::from_crd(&crd));
    }
    builder
}
