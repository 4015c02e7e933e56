// SDKExtension: the worker-side runtime that extension executables link (shared/DESIGN.md "Extension API").
// The runtime lands with issue 3; for now the module re-exports the wire value model.
@_exported import SDKWire
