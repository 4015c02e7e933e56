// SDKHost: the app-facing client library (shared/DESIGN.md "Host API"). The embedded host engine lands here
// with issue 3; for now the module re-exports the wire value model that its API is expressed in.
@_exported import SDKWire
