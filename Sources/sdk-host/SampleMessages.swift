// A typical request message, used by the demo and the codec benchmark: a `begin` carrying one extension item,
// sized like the 300-byte message of shared/DESIGN.md's codec target.
import SDKWire

enum SampleMessages {
    static let begin: PlistValue = [
        "type": MessageType.begin.plist,
        "id": "6F9619FF-8B86-D011-B42D-00C04FC964FF",
        "items": [
            [
                "title": "Analytics event",
                "attachments": ["screen_view", .data(Array(repeating: 0xAB, count: 8))],
                "userInfo": [
                    "screen": "Checkout", "durationMs": 1234, "ratio": 0.75, "firstLaunch": false,
                    "locale": "en_GB", "retries": 3,
                ],
            ]
        ],
    ]
}
