//! Images without a registry: the product image the Dockerfile describes,
//! the pause image and the example app, as OCI archives.
