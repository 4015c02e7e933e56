// The wire model's value types, under SDKHost's name. An app that imports SDKHost sees these and nothing else
// of SDKWire: `Message`, `Frame` and the codecs stay out of its namespace unless it imports SDKWire itself.
import SDKWire

public typealias RequestID = SDKWire.RequestID
public typealias ExtensionItem = SDKWire.ExtensionItem
public typealias ExtensionError = SDKWire.ExtensionError
public typealias PlistValue = SDKWire.PlistValue
public typealias PlistDate = SDKWire.PlistDate
public typealias PlistValueEncoder = SDKWire.PlistValueEncoder
public typealias PlistValueDecoder = SDKWire.PlistValueDecoder
public typealias FileAttachment = SDKWire.FileAttachment
public typealias FileAttachmentError = SDKWire.FileAttachmentError
