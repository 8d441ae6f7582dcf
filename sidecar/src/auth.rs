//! Credentials added to requests that carry none.

use http::HeaderMap;

/// OAuth scope for GCS data and metadata.
#[cfg(feature = "adc")]
const SCOPE: &str = "https://www.googleapis.com/auth/devstorage.full_control";

/// How requests without an `Authorization` header are authenticated upstream.
#[derive(Clone, Debug)]
pub enum Auth {
    /// Forward as is (emulators; `--no-auth`).
    None,
    /// Application Default Credentials (GKE Workload Identity, a key file, gcloud).
    /// The credentials cache the token and refresh it ahead of expiry.
    #[cfg(feature = "adc")]
    Adc(google_cloud_auth::credentials::Credentials),
    /// Fixed headers (tests).
    Static(HeaderMap),
}

impl Auth {
    /// Builds Application Default Credentials; fails only when the ADC
    /// configuration itself is invalid (on GKE it resolves to the metadata server).
    #[cfg(feature = "adc")]
    pub fn application_default() -> anyhow::Result<Self> {
        let credentials = google_cloud_auth::credentials::Builder::default()
            .with_scopes([SCOPE])
            .build()
            .map_err(|e| anyhow::anyhow!("cannot load Application Default Credentials: {e}"))?;
        Ok(Self::Adc(credentials))
    }

    /// Without the `adc` feature there are no Application Default Credentials.
    #[cfg(not(feature = "adc"))]
    pub fn application_default() -> anyhow::Result<Self> {
        anyhow::bail!(
            "bucketmap-sidecar was built without the `adc` feature: run it with --no-auth"
        )
    }

    /// Whether there are credentials to add (the policy's `adc`).
    pub fn adds(&self) -> bool {
        !matches!(self, Auth::None)
    }

    /// The headers to add to a request that has no `Authorization` header.
    /// Token values are never logged.
    pub async fn headers(&self) -> Result<Option<HeaderMap>, String> {
        match self {
            Auth::None => Ok(None),
            Auth::Static(headers) => Ok(Some(headers.clone())),
            #[cfg(feature = "adc")]
            Auth::Adc(credentials) => {
                use google_cloud_auth::credentials::CacheableResource;
                match credentials.headers(http::Extensions::new()).await {
                    Ok(CacheableResource::New { data, .. }) => Ok(Some(data)),
                    // Only returned when an entity tag is passed in, which we never do.
                    Ok(CacheableResource::NotModified) => {
                        Err("the credentials returned no headers".to_owned())
                    }
                    Err(err) => Err(err.to_string()),
                }
            }
        }
    }
}
