//! Requests to the Hub. Redirects are followed here, not by the HTTP client, so that each hop
//! is decided on: the token goes only to the endpoint's own origin (scheme, host and port of
//! `HF_ENDPOINT`), never to a host a redirect leads to (the Hub's CDN links are signed and
//! need none), and at most [`MAX_REDIRECTS`] are followed.

use std::time::Duration;

use url::Url;

/// Redirects followed for one request, at most.
pub const MAX_REDIRECTS: usize = 10;

/// Why a request got no usable answer.
#[derive(Debug)]
pub enum Failure {
    /// An HTTP error status (400 and above).
    Status(u16),
    /// The connection failed or broke.
    Transport(String),
    /// A redirect that is not followed: one too many, or a Location that is not http(s).
    Redirect(String),
}

/// Which redirects to follow.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Follow {
    All,
    /// Only those whose Location is a path on the same server (as `huggingface_hub` does to
    /// read a file's metadata: the answer before the redirect to the CDN carries it).
    Relative,
}

pub struct Client {
    agent: ureq::Agent,
    endpoint: Url,
    token: Option<String>,
}

impl Client {
    pub fn new(endpoint: Url, token: Option<String>) -> Client {
        let agent = ureq::AgentBuilder::new()
            .redirects(0)
            .try_proxy_from_env(true)
            .timeout_connect(Duration::from_secs(30))
            .timeout_read(Duration::from_secs(120))
            .build();
        Client {
            agent,
            endpoint,
            token,
        }
    }

    pub fn endpoint(&self) -> &Url {
        &self.endpoint
    }

    /// Whether the token may go to `url`: only to the endpoint's scheme, host and port.
    pub fn authorizes(&self, url: &Url) -> bool {
        url.origin() == self.endpoint.origin()
    }

    /// `method` on `url` (with `Range: bytes=FROM-` when `range_from` is given), following
    /// redirects as `follow` says. Returns the answer (a status below 400; a redirect that
    /// was not followed included) and the URL that gave it.
    pub fn send(
        &self,
        method: &str,
        url: Url,
        range_from: Option<u64>,
        follow: Follow,
    ) -> Result<(Url, ureq::Response), Failure> {
        let mut url = url;
        for _ in 0..=MAX_REDIRECTS {
            // Bytes as stored, so that sizes and ranges count what is written.
            let mut request = self
                .agent
                .request_url(method, &url)
                .set("Accept-Encoding", "identity");
            if let Some(token) = self.token.as_ref().filter(|_| self.authorizes(&url)) {
                request = request.set("Authorization", &format!("Bearer {token}"));
            }
            if let Some(from) = range_from {
                request = request.set("Range", &format!("bytes={from}-"));
            }
            let response = match request.call() {
                Ok(response) => response,
                Err(ureq::Error::Status(status, _)) => return Err(Failure::Status(status)),
                Err(ureq::Error::Transport(t)) => return Err(Failure::Transport(t.to_string())),
            };
            if !(300..400).contains(&response.status()) {
                return Ok((url, response));
            }
            let Some(location) = response.header("Location") else {
                return Ok((url, response));
            };
            if follow == Follow::Relative && !is_relative(location) {
                return Ok((url, response));
            }
            url = next_url(&url, location)?;
        }
        Err(Failure::Redirect(format!(
            "more than {MAX_REDIRECTS} redirects"
        )))
    }
}

/// Where a redirect from `url` with `location` leads, if it is an http(s) URL.
pub fn next_url(url: &Url, location: &str) -> Result<Url, Failure> {
    let next = url
        .join(location)
        .map_err(|e| Failure::Redirect(format!("a redirect to `{location}` ({e})")))?;
    if !matches!(next.scheme(), "http" | "https") {
        return Err(Failure::Redirect(format!(
            "a redirect to `{next}`, not an http(s) URL"
        )));
    }
    Ok(next)
}

/// Whether a Location is a path on the same server (no scheme, no host).
fn is_relative(location: &str) -> bool {
    !location.starts_with("//")
        && matches!(
            Url::parse(location),
            Err(url::ParseError::RelativeUrlWithoutBase)
        )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_token_goes_only_to_the_endpoint_origin() {
        let client = Client::new(
            Url::parse("https://hub.example/mirror").unwrap(),
            Some("t".into()),
        );
        let yes = ["https://hub.example/x", "https://hub.example:443/a/b"];
        let no = [
            "http://hub.example/x",
            "https://hub.example:8443/x",
            "https://cdn.hub.example/x",
            "https://hub.example.evil/x",
        ];
        for u in yes {
            assert!(client.authorizes(&Url::parse(u).unwrap()), "{u}");
        }
        for u in no {
            assert!(!client.authorizes(&Url::parse(u).unwrap()), "{u}");
        }
    }

    #[test]
    fn relative_locations_are_told_apart() {
        assert!(is_relative("/org/name/resolve/main/f.gguf"));
        assert!(is_relative("other"));
        assert!(!is_relative("//cdn.example/f"));
        assert!(!is_relative("https://cdn.example/f"));
        let base = Url::parse("https://hub.example/a/b").unwrap();
        assert!(next_url(&base, "file:///etc/passwd").is_err());
        assert_eq!(
            next_url(&base, "/c").unwrap().as_str(),
            "https://hub.example/c"
        );
    }
}
