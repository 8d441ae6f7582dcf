//! Credentials for the upstream: a request whose own `Authorization` does
//! not reach the upstream (none was sent, or the `Connection` header makes
//! it hop-by-hop) gets the headers of the configured [`Auth`] (Application
//! Default Credentials; the rule is the policy's,
//! [`crate::policy::adds_credentials`], which the gRPC path applies too), added by the core where the forwarded headers lack
//! them. A request that carries its own `Authorization` keeps it and costs
//! no token. Runs after [`super::refuse`]: a refused request never asks for
//! a token.

use std::convert::Infallible;
use std::sync::Arc;
use std::task::{Context, Poll};

use tower::{Layer, Service};

use super::refuse::Routed;
use super::{Answer, BoxFuture, Either, rejection};
use crate::auth::Auth;
use crate::errors::ApiError;
use crate::hop_by_hop::forwards_authorization;
use crate::policy::adds_credentials;

/// Adds credentials to requests without their own.
#[derive(Clone, Debug)]
pub struct CredentialsLayer {
    auth: Arc<Auth>,
}

impl CredentialsLayer {
    /// Adds the credentials of `auth` (none for [`Auth::None`]).
    pub fn new(auth: Auth) -> Self {
        Self {
            auth: Arc::new(auth),
        }
    }
}

impl<S> Layer<S> for CredentialsLayer {
    type Service = Credentials<S>;

    fn layer(&self, inner: S) -> Credentials<S> {
        Credentials {
            inner,
            auth: self.auth.clone(),
        }
    }
}

/// See [`CredentialsLayer`].
#[derive(Clone, Debug)]
pub struct Credentials<S> {
    inner: S,
    auth: Arc<Auth>,
}

impl<S, B> Service<Routed<B>> for Credentials<S>
where
    S: Service<Routed<B>, Response = Answer, Error = Infallible> + Clone + Send + 'static,
    S::Future: Send,
    B: Send + 'static,
{
    type Response = Answer;
    type Error = Infallible;
    type Future = Either<S::Future, BoxFuture<Result<Answer, Infallible>>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut routed: Routed<B>) -> Self::Future {
        let own = forwards_authorization(routed.request.headers());
        if !adds_credentials(own, self.auth.adds()) {
            return Either::left(self.inner.call(routed));
        }
        let auth = self.auth.clone();
        // The service polled ready serves this request; a clone takes its place.
        let fresh = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, fresh);
        Either::right(Box::pin(async move {
            match auth.headers().await {
                Ok(headers) => {
                    routed.credentials = headers;
                    inner.call(routed).await
                }
                Err(detail) => {
                    tracing::warn!(error = %detail, "cannot obtain credentials");
                    let error = ApiError::credentials_unavailable(&detail);
                    let route = &routed.route;
                    Ok(rejection(error, route.api.error_style(), route.operation))
                }
            }
        }))
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use http::header::{AUTHORIZATION, CONNECTION};
    use http::uri::PathAndQuery;
    use http::{HeaderMap, HeaderValue, Method, Request};
    use tower::{ServiceExt as _, service_fn};

    use super::*;
    use crate::mapping::Mapping;
    use crate::route::route;

    fn routed(headers: &[(http::HeaderName, &'static str)]) -> Routed<()> {
        let mut request = Request::new(());
        for (name, value) in headers {
            request
                .headers_mut()
                .append(name, HeaderValue::from_static(value));
        }
        let path = "/storage/v1/b/photos/o";
        let route = route(&Method::GET, path, None, None).unwrap_or_else(|e| panic!("{e}"));
        let entries = [("photos".to_owned(), "photos-k3x9q2mw".to_owned())];
        Routed {
            request,
            route,
            method: Method::GET,
            mapping: Arc::new(Mapping::new(entries).unwrap_or_else(|e| panic!("{e}"))),
            host: "127.0.0.1:9023".to_owned(),
            upstream_path: PathAndQuery::from_static("/storage/v1/b/photos-k3x9q2mw/o"),
            credentials: None,
            access: crate::policy::Access {
                writes: false,
                stale: None,
            },
        }
    }

    fn static_auth() -> Auth {
        let mut headers = HeaderMap::new();
        headers.insert(AUTHORIZATION, HeaderValue::from_static("Bearer from-adc"));
        headers.insert("x-goog-user-project", HeaderValue::from_static("p"));
        Auth::Static(headers)
    }

    /// The credentials the core is handed for `request`.
    async fn handed(auth: Auth, request: Routed<()>) -> Option<HeaderMap> {
        let seen = Arc::new(Mutex::new(None));
        let keep = seen.clone();
        let inner = service_fn(move |routed: Routed<()>| {
            if let Ok(mut seen) = keep.lock() {
                *seen = Some(routed.credentials);
            }
            let answer = Answer::new(http::Response::new(crate::body::empty()), "inner");
            std::future::ready(Ok::<_, Infallible>(answer))
        });
        let Ok(answer) = CredentialsLayer::new(auth)
            .layer(inner)
            .oneshot(request)
            .await;
        assert_eq!(answer.response.status(), 200);
        let handed = seen.lock().map(|mut s| s.take());
        handed
            .unwrap_or_else(|_| panic!("poisoned"))
            .unwrap_or_else(|| panic!("the core was not called"))
    }

    #[tokio::test]
    async fn a_request_without_authorization_gets_the_credentials() {
        let credentials = handed(static_auth(), routed(&[])).await;
        let credentials = credentials.unwrap_or_else(|| panic!("no credentials"));
        assert_eq!(
            credentials.get(AUTHORIZATION).map(|v| v.as_bytes()),
            Some(&b"Bearer from-adc"[..])
        );
        assert!(credentials.contains_key("x-goog-user-project"));
    }

    #[tokio::test]
    async fn a_request_with_its_own_authorization_keeps_it() {
        let own = routed(&[(AUTHORIZATION, "Bearer own")]);
        assert_eq!(handed(static_auth(), own).await, None);
    }

    #[tokio::test]
    async fn an_authorization_made_hop_by_hop_does_not_count() {
        let hop = routed(&[
            (AUTHORIZATION, "Bearer own"),
            (CONNECTION, "keep-alive, Authorization"),
        ]);
        assert!(handed(static_auth(), hop).await.is_some());
    }

    #[tokio::test]
    async fn without_auth_nothing_is_added() {
        assert_eq!(handed(Auth::None, routed(&[])).await, None);
    }
}
